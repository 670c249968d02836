#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ (committed).

Seeds are small and meaningful: valid inputs as docs/api.md and the fixtures show them, each error
the parsers name once, and the edge cases next to them. Fuzzer findings worth keeping (reproducers
of fixed bugs) are added by hand as corpus/<target>/regress-<what>, and this script leaves those
alone. Run it again after changing a seed here:  python3 tests/fuzz/make_corpus.py
The proto seeds are encoded from text format with `protoc --encode` (protobuf-compiler).
"""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def line(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def chat(cid, messages, **body):
    return line({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                 "body": dict(messages=messages, **body)})


def completion(cid, prompt, **body):
    return line({"custom_id": cid, "method": "POST", "url": "/v1/completions",
                 "body": dict(prompt=prompt, **body)})


def responses(cid, input, **body):
    return line({"custom_id": cid, "method": "POST", "url": "/v1/responses",
                 "body": dict(input=input, **body)})


def nested(depth):
    """`depth` arrays inside one another (the parsers refuse JSON deeper than 128 levels)."""
    return "[" * depth + "]" * depth


def user(text):
    return {"role": "user", "content": text}


# --- fuzz_jsonl_request: CreateJobRequest.jsonl payloads -------------------------------------------
def jsonl_seeds():
    t = "fuzz_jsonl_request"
    # docs/api.md's input line.
    write(t, "api-doc-chat", chat("q-1", [user("Hello")], model="mixtral", max_tokens=64) + "\n")
    write(t, "chat-every-field", chat(
        "job-7",
        [{"role": "system", "content": "Be brief."}, user("Hello"),
         {"role": "assistant", "content": "Hi."}, user("Bye")],
        model="mixtral", max_tokens=4, temperature=0.5, top_p=0.9, top_k=40, seed=1234,
        stop=["\n\n", "END"], n=1, ignore_eos=True, presence_penalty=0.1,
        response_format={"type": "text"}) + "\n")
    write(t, "responses-string", responses("r-1", "Hello", model="mixtral",
                                           instructions="Be brief.", max_output_tokens=8) + "\n")
    write(t, "responses-items", responses(
        "r-2", [{"type": "message", "role": "developer", "content": "Answer in French."},
                {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Salut"}]},
                user("Bye")],
        top_logprobs=2, include=["message.output_text.logprobs"], temperature=0) + "\n")
    write(t, "err-responses-max-tokens", responses("r-3", "Hi", max_tokens=5) + "\n")
    write(t, "json-output", chat("j", [user("Hi")], response_format={"type": "json_object"})
          + "\n" + responses("r-4", "Hi", text={"format": {"type": "json_schema"}}) + "\n")
    write(t, "chat-content-parts", chat(
        "parts", [{"role": "user", "content": [{"type": "text", "text": "one"},
                                               {"type": "text", "text": "two"}]}],
        max_completion_tokens=3) + "\n")
    write(t, "completion-text", completion("c-1", "The capital of France is", max_tokens=5,
                                           temperature=0, stop="\n", seed=18446744073709551615)
          + "\n")
    write(t, "completion-ids", completion("ids", [1, 415, 5565, 302, 4843, 349], max_tokens=2)
          + "\n" + completion("ids-nested", [[31999, 0, 2]]) + "\n"
          + completion("one-string", ["Ünïcödé ✓ 漢字 🙂"]) + "\n")
    write(t, "nulls", chat("n", [user("x")], model=None, max_tokens=None, temperature=None,
                           seed=None, stop=None, n=None) + "\n")
    # Several requests, CRLF line ends, trailing blank lines (not requests).
    write(t, "multi-line", "\r\n".join([
        chat("a", [user("first")]), completion("b", "second", max_tokens=1),
        chat("c", [user("third")], temperature=2.0)]) + "\r\n\n  \n\t\n")
    # Long prompt / large max_tokens: prefailed under small contexts, not a whole-job error.
    write(t, "prefail-lengths", completion("long", "word " * 40, max_tokens=4) + "\n"
          + completion("budget", "short", max_tokens=2147483647) + "\n")
    # Whole-job errors, one each.
    write(t, "err-duplicate-id", chat("same", [user("a")]) + "\n" + chat("same", [user("b")]))
    write(t, "err-roles", chat("r", [user("a"), user("b")]) + "\n"
          + chat("r2", [{"role": "assistant", "content": "x"}]) + "\n"
          + chat("r3", [user("a"), {"role": "assistant", "content": ""}, user("b")]))
    write(t, "err-not-json", '{"custom_id": "x", "method": "POST"\n[1, 2]\n"str"\n')
    write(t, "err-bad-utf8", b'{"custom_id": "u", "method": "POST", "url": "/v1/completions", '
          b'"body": {"prompt": "\xff\xfe"}}\n')
    write(t, "err-surrogate", '{"custom_id": "s", "method": "POST", "url": "/v1/completions", '
          '"body": {"prompt": "\\ud800"}}\n')
    write(t, "err-url-method", line({"custom_id": "u", "method": "GET", "url": "/v1/embeddings",
                                     "body": {}}) + "\n"
          + line({"custom_id": "u2", "method": "POST", "url": "/v1/embeddings", "body": {}}))
    write(t, "err-model", chat("m", [user("x")], model="gpt-4") + "\n")
    write(t, "err-ranges", "\n".join([
        chat("e1", [user("x")], max_tokens=0), chat("e2", [user("x")], temperature=-1),
        chat("e3", [user("x")], top_p=0), chat("e4", [user("x")], top_k=-1),
        chat("e5", [user("x")], n=2), chat("e6", [user("x")], stop=["a", "b", "c", "d", "e"]),
        chat("e7", [user("x")], stop=""), chat("e8", [user("x")], seed=-1),
        chat("e9", [user("x")], max_tokens=16.0), chat("e10", [user("x")], max_tokens="16"),
        chat("e11", [user("x")], max_tokens=4, max_completion_tokens=5),
        chat("e12", [user("x")], ignore_eos="yes"), chat("e13", [user("x")], temperature=1e300),
        completion("e14", [-1]), completion("e15", [32000]), completion("e16", [4294967296]),
        completion("e17", []), completion("e18", ["a", "b"]), completion("e19", [[]]),
        completion("e20", ""), line({"custom_id": "", "method": "POST"}),
        line({"custom_id": 7}), chat("e22", []),
        chat("e23", [{"role": "user", "content": [{"type": "image_url"}]}])]) + "\n")
    write(t, "err-empty-job", "\n \r\n\t\n")
    # At the nesting limit (the line's object, the body, 126 arrays) and one past it.
    deep = '{"custom_id": "deep", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "x": '
    write(t, "depth-128", deep + nested(126) + "}}\n")
    write(t, "err-depth-129", deep + nested(127) + "}}\n")


# --- fuzz_proto_request: serialized moebatch.v1.CreateJobRequest -----------------------------------
PROTO_SEEDS = {
    "inline-every-input": r'''
requests {
  requests { custom_id: "chat" chat { messages { role: "system" content: "Be brief." }
      messages { role: "user" content: "Hello" } messages { role: "assistant" content: "Hi." }
      messages { role: "user" content: "Bye" } }
    sampling { temperature: 0.5 top_p: 0.9 top_k: 40 seed: 1234 max_tokens: 4 stop: "END"
      stop: "\n\n" ignore_eos: true } }
  requests { custom_id: "text" prompt: "The capital of France is" sampling { temperature: 0 } }
  requests { custom_id: "ids" prompt_token_ids { ids: 1 ids: 415 ids: 31999 } }
}
model: "mixtral"
metadata { key: "owner" value: "fuzz" }
''',
    "inline-defaults": r'''
requests { requests { custom_id: "d" prompt: "x" } }
''',
    "err-no-input": r'''
requests { requests { custom_id: "no-input" } }
''',
    "err-token-ids": r'''
requests { requests { custom_id: "neg" prompt_token_ids { ids: 5 ids: -1 } } }
''',
    "err-token-id-vocab": r'''
requests { requests { custom_id: "big" prompt_token_ids { ids: 32000 } } }
''',
    "err-sampling-ranges": r'''
requests { requests { custom_id: "t" prompt: "x" sampling { temperature: -1 top_p: 0 top_k: -3 max_tokens: 0 } } }
''',
    "err-stop": r'''
requests { requests { custom_id: "s" prompt: "x" sampling { stop: "" stop: "a" stop: "b" stop: "c" stop: "d" } } }
''',
    "err-chat": r'''
requests { requests { custom_id: "c" chat { messages { role: "user" content: "a" } messages { role: "tool" content: "b" } } }
  requests { custom_id: "" chat { } } }
''',
    "inline-nonfinite": r'''
requests {
  requests { custom_id: "nan" prompt: "x" sampling { temperature: nan } }
  requests { custom_id: "inf" prompt: "x" sampling { top_p: inf } }
}
''',
    "inline-duplicate": r'''
requests { requests { custom_id: "same" prompt: "a" } requests { custom_id: "same" prompt: "b" } }
''',
    "inline-prefail": r'''
requests {
  requests { custom_id: "long" prompt: "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty" }
  requests { custom_id: "budget" prompt: "short" sampling { max_tokens: 2147483647 } }
}
''',
    "jsonl": r'''
jsonl: "{\"custom_id\": \"q-1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {\"model\": \"mixtral\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 64}}\n{\"custom_id\": \"q-2\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [1, 2, 3]}}\n"
''',
    "jsonl-not-utf8": r'''
jsonl: "{\"custom_id\": \"u\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"\377\"}}"
''',
    "wrong-model": r'''
model: "gpt-4"
requests { requests { custom_id: "m" prompt: "x" } }
''',
    "empty": "",
}


def proto_seeds():
    proto = os.path.join(ROOT, "proto", "moebatch", "v1", "batch.proto")
    for name, text in PROTO_SEEDS.items():
        done = subprocess.run(
            ["protoc", "--proto_path=" + os.path.join(ROOT, "proto"),
             "--encode=moebatch.v1.CreateJobRequest", proto],
            input=text.encode(), capture_output=True)
        if done.returncode != 0:
            sys.exit(f"make_corpus: protoc --encode failed for {name}: {done.stderr.decode()}")
        write("fuzz_proto_request", name, done.stdout)


# --- fuzz_model_config: config.json -----------------------------------------------------------------
def config_seeds():
    t = "fuzz_model_config"
    for name, path in [("tiny-mixtral", "tiny-mixtral/config.json"),
                       ("tiny-mixtral-swa", "tiny-mixtral-swa/config.json")]:
        with open(os.path.join(FIXTURES, path), "rb") as f:
            write(t, name, f.read())
    with open(os.path.join(ROOT, "bench", "models", "mixtral-8x7b", "config.json"), "rb") as f:
        write(t, "mixtral-8x7b", f.read())
    base = {"architectures": ["MixtralForCausalLM"], "vocab_size": 32000, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2}
    write(t, "minimal", json.dumps(base))
    write(t, "transformers5", json.dumps(dict(
        base, dtype="float16", head_dim=32, num_key_value_heads=None, eos_token_id=[2, 32000],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=4096,
        tie_word_embeddings=True)))
    write(t, "err-rope-scaling", json.dumps(dict(base, rope_scaling={"type": "yarn", "factor": 4})))
    write(t, "err-values", json.dumps(dict(
        base, architectures=["LlamaForCausalLM", 7], num_key_value_heads=3, hidden_size=-1,
        num_experts_per_tok=9, rope_theta=0, rms_norm_eps="1e-5", torch_dtype="int8",
        bos_token_id=2147483648, vocab_size=18446744073709551615)))
    write(t, "huge-sizes", json.dumps(dict(
        base, num_attention_heads=4294967296, num_key_value_heads=4294967296,
        head_dim=4294967296, hidden_size=9223372036854775807)))
    write(t, "err-not-object", "[1, 2, 3]")
    write(t, "err-depth-129", json.dumps(base)[:-1] + ', "x": ' + nested(128) + "}")


# --- fuzz_safetensors_header: file images, or "<header JSON>\0<data>" ------------------------------
def safetensors_image(header_text, data=b""):
    raw = header_text.encode()
    return struct.pack("<Q", len(raw)) + raw + data


def header_of(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, nbytes)] packed in order; returns (header text, data)."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + nbytes]}
        data += bytes((len(data) + i) % 251 for i in range(nbytes))
    text = json.dumps(header, separators=(",", ":"))
    if pad:
        text += " " * (-len(text) % 8)  # the reference writer pads to 8 bytes
    return text, data


def header_seeds():
    t = "fuzz_safetensors_header"
    sizes = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
             "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
    every = [(f"t.{d}", d, [2], 2 * n) for d, n in sizes.items()]
    text, data = header_of(every, {"format": "pt"})
    write(t, "file-every-dtype", safetensors_image(text, data))
    text, data = header_of([("scalar", "F32", [], 4), ("empty", "BF16", [0, 4], 0),
                            ("m", "BF16", [2, 3], 12)])
    write(t, "file-scalar-empty", safetensors_image(text, data))
    # Mixtral names and layout (as tests/fixtures/tiny-mixtral/model.safetensors), tiny shapes.
    mixtral = [("lm_head.weight", "BF16", [8, 4], 64), ("model.embed_tokens.weight", "BF16", [8, 4], 64),
               ("model.layers.0.block_sparse_moe.experts.0.w1.weight", "BF16", [6, 4], 48),
               ("model.layers.0.block_sparse_moe.gate.weight", "BF16", [2, 4], 16),
               ("model.layers.0.input_layernorm.weight", "BF16", [4], 8),
               ("model.norm.weight", "BF16", [4], 8)]
    text, data = header_of(mixtral, {"format": "pt"})
    write(t, "file-mixtral-names", safetensors_image(text, data))
    write(t, "text-mixtral-names", text.encode() + b"\0" + data)
    # The real fixture's header opening (its offsets point past this seed: DataLoss).
    with open(os.path.join(FIXTURES, "tiny-mixtral", "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    first = dict(list(header.items())[:4])
    write(t, "text-fixture-opening", json.dumps(first, separators=(",", ":")))
    # One error each, in text form (the target writes the length field).
    for name, entry in [
            ("err-no-offsets", {"dtype": "F32", "shape": [1]}),
            ("err-dtype", {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 1]}),
            ("err-negative-dim", {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}),
            ("err-offset-order", {"dtype": "U8", "shape": [1], "data_offsets": [2, 1]}),
            ("err-size-mismatch", {"dtype": "I16", "shape": [2, 3], "data_offsets": [0, 10]}),
            ("err-numel-overflow", {"dtype": "F64", "shape": [4294967296, 4294967296],
                                    "data_offsets": [0, 8]}),
            ("err-zero-dim-overflow", {"dtype": "F64", "shape": [0, 18446744073709551615,
                                                                 18446744073709551615],
                                       "data_offsets": [0, 0]}),
            ("err-past-end", {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})]:
        write(t, name, json.dumps({"t": entry}).encode() + b"\0" + b"1234")
    write(t, "err-not-object", b"[1, 2]")
    write(t, "err-depth-129", ('{"t": {"dtype": "U8", "shape": ' + nested(128)
                               + ', "data_offsets": [0, 0]}}').encode())
    write(t, "err-length-past-end", struct.pack("<Q", 1 << 40) + b'{"a":1}')
    write(t, "err-short", b"\x02\0\0")


# --- fuzz_safetensors_index: model.safetensors.index.json -------------------------------------------
def index_seeds():
    t = "fuzz_safetensors_index"
    with open(os.path.join(FIXTURES, "tiny-mixtral-sharded", "model.safetensors.index.json")) as f:
        index = json.load(f)
    excerpt = dict(list(index["weight_map"].items())[:3] + list(index["weight_map"].items())[-3:])
    write(t, "fixture-excerpt", json.dumps({"metadata": index["metadata"], "weight_map": excerpt},
                                           indent=2))
    write(t, "one-shard", json.dumps({"weight_map": {"a": "model.safetensors"}}))
    write(t, "err-no-map", json.dumps({"metadata": {"total_size": 1}}))
    write(t, "err-empty-map", json.dumps({"weight_map": {}}))
    write(t, "err-shard-types", json.dumps({"weight_map": {"a": "", "b": 7, "c": None}}))
    write(t, "err-not-json", '{"metadata": {}, "weight_map": {"a": ')
    write(t, "err-depth-129", '{"weight_map": {"a": "s"}, "metadata": ' + nested(127) + "}")


# --- fuzz_gguf: GGUF file images (engine/model/gguf.h's layout) ----------------------------------
def gguf_string(text):
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(vtype, value):
    """(type id, bytes) of a metadata value; vtype a struct format or "s" / ("a", sub)."""
    if vtype == "s":
        return 8, gguf_string(value)
    if isinstance(vtype, tuple):  # array of sub type
        sub_id, _ = gguf_value(vtype[1], value[0]) if value else (0, b"")
        body = b"".join(gguf_value(vtype[1], v)[1] for v in value)
        return 9, struct.pack("<IQ", sub_id, len(value)) + body
    ids = {"B": 0, "b": 1, "H": 2, "h": 3, "I": 4, "i": 5, "f": 6, "?": 7, "Q": 10, "q": 11,
           "d": 12}
    return ids[vtype], struct.pack("<" + vtype, value)


def gguf_image(metadata, tensors, alignment=32, version=3):
    """metadata: [(key, vtype, value)]; tensors: [(name, ne, ggml type, block, type_size)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
    for key, vtype, value in metadata:
        tid, body = gguf_value(vtype, value)
        out += gguf_string(key) + struct.pack("<I", tid) + body
    offset, data = 0, b""
    for name, ne, gtype, block, size in tensors:
        n = 1
        for d in ne:
            n *= d
        nbytes = n // block * size
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(
            struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", gtype, offset)
        chunk = bytes((offset + i) % 251 for i in range(nbytes))
        chunk += b"\0" * (-len(chunk) % alignment)
        data += chunk
        offset += len(chunk)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def gguf_seeds():
    t = "fuzz_gguf"
    llama = [("general.architecture", "s", "llama"), ("llama.block_count", "I", 1),
             ("llama.embedding_length", "I", 32), ("llama.rope.freq_base", "f", 10000.0),
             ("tokenizer.ggml.model", "s", "gpt2"),
             ("tokenizer.ggml.tokens", ("a", "s"), ["<s>", "</s>", "a", "b"]),
             ("tokenizer.ggml.token_type", ("a", "i"), [3, 3, 1, 1]),
             ("tokenizer.ggml.add_bos_token", "?", True)]
    tensors = [("token_embd.weight", [32, 4], 8, 32, 34),      # Q8_0
               ("blk.0.attn_norm.weight", [32], 0, 1, 4),      # F32
               ("blk.0.attn_q.weight", [32, 32], 3, 32, 20),   # Q4_1
               ("blk.0.ffn_down.weight", [256, 2], 12, 256, 144),  # Q4_K
               ("blk.0.ffn_up.weight", [256, 1], 14, 256, 210),    # Q6_K
               ("blk.0.exps.weight", [32, 2, 2], 39, 32, 17)]      # MXFP4, 3 dimensions
    write(t, "llama-like", gguf_image(llama, tensors))
    write(t, "every-scalar", gguf_image(
        [(f"k.{c}", c, v) for c, v in [("B", 7), ("b", -7), ("H", 7), ("h", -7), ("I", 7),
                                        ("i", -7), ("f", 0.5), ("?", False), ("Q", 7), ("q", -7),
                                        ("d", 0.25)]] + [("k.align", "I", 64)], [], 64))
    write(t, "alignment-64", gguf_image([("general.alignment", "I", 64)],
                                        [("t", [64], 2, 32, 18)], 64))
    write(t, "version-2", gguf_image([], [("t", [4], 1, 1, 2)], version=2))
    write(t, "empty", gguf_image([], []))
    write(t, "err-magic", b"GGUG" + gguf_image([], [])[4:])
    write(t, "err-truncated", gguf_image(llama, tensors)[:-7])
    write(t, "err-row-not-blocks", gguf_image([], [("t", [33], 2, 32, 18)]))
    write(t, "err-alignment-3", gguf_image([("general.alignment", "I", 3)], []))
    # Found by the fuzzer: numel fits in int64, numel x 4 bytes does not (no data written here).
    write(t, "regress-nbytes-overflow", gguf_image([], [("t", [2**62], 0, 1, 0)]))


def main():
    gguf_seeds()
    jsonl_seeds()
    proto_seeds()
    config_seeds()
    header_seeds()
    index_seeds()
    total = sum(len(files) for _, _, files in os.walk(CORPUS))
    print(f"make_corpus: {total} seed files under {os.path.relpath(CORPUS, ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
