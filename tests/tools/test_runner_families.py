#!/usr/bin/env python3
"""End-to-end test of moebatch-run on the tiny golden fixtures of the model families beyond Mixtral
(llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, olmoe, dbrx: tests/fixtures/make_tiny_families.py;
run by ctest; plain python3, no packages).

For each family: one moebatch-run over the 8 golden prompts as token-id completion lines (greedy,
ignore_eos, 32 tokens) must reproduce transformers' greedy tokens and text; a chat line must
complete with the Mistral instruct layout (the fixtures' tokenizer is Mixtral's sentencepiece
tokenizer.model): its tokens equal those of a completion line whose prompt is the laid-out text
"[INST] Hello [/INST]". Then bad model directories (copies of a fixture, weights symlinked) must
be refused before any request runs: exit 1, no output file, and one message naming the file and
the field (unknown model_type or architecture, impossible shapes, weights that do not fit the
config, a corrupt or unsupported tokenizer.json, a tokenizer_config.json of the wrong type, a
tokenizer larger than the vocabulary, no tokenizer at all).

Usage: test_runner_families.py MOEBATCH_RUN FIXTURES_DIR
"""
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAMILIES = ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-qwen2-moe",
            "tiny-qwen3-moe", "tiny-olmoe", "tiny-dbrx", "tiny-deepseek-v2", "tiny-deepseek-v3",
            "tiny-gpt-oss"]
SUPPORTED = ["dbrx", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama", "mistral", "mixtral",
             "olmoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"]
# "[INST] Hello [/INST]" with Mixtral's sentencepiece model: BOS + 8 pieces.
CHAT_PROMPT_TOKENS = 9


def run(runner, model, lines, tmp, timeout=120):
    """Runs moebatch-run on `lines` (dicts); returns (process, output lines or None)."""
    inp, out = Path(tmp, "in.jsonl"), Path(tmp, "out.jsonl")
    inp.write_text("".join(json.dumps(l) + "\n" for l in lines))
    if out.exists():
        out.unlink()
    proc = subprocess.run([runner, "--model", str(model), "--input", str(inp), "--output",
                           str(out), "--progress=false", "--kv_cache_gb", "0.25"],
                          capture_output=True, text=True, timeout=timeout)
    outputs = [json.loads(l) for l in out.read_text().splitlines()] if out.exists() else None
    return proc, outputs


def completion(custom_id, prompt, max_tokens):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                     "ignore_eos": True}}


def check_family(runner, fixtures, name, tmp):
    model = fixtures / name
    golden = [json.loads(l) for l in open(model / "golden.jsonl")]
    assert len(golden) == 8, (name, len(golden))
    arch = json.loads((model / "config.json").read_text())["architectures"][0]
    lines = [completion(f"golden-{i}", g["prompt_token_ids"], len(g["greedy_token_ids"]))
             for i, g in enumerate(golden)]
    lines.append({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
                           "temperature": 0, "ignore_eos": True}})
    lines.append(completion("chat-as-text", "[INST] Hello [/INST]", 8))
    proc, outputs = run(runner, model, lines, tmp)
    assert proc.returncode == 0, (name, proc.stderr[-3000:])
    assert f"loaded {arch} from {model}" in proc.stderr, (name, proc.stderr[-3000:])
    assert "done: 10 lines, 10 requests ran, 0 failed lines" in proc.stderr, (name, proc.stderr)
    assert [o["custom_id"] for o in outputs] == [l["custom_id"] for l in lines], name
    for i, g in enumerate(golden):
        o = outputs[i]
        assert o["error"] is None and o["response"]["status_code"] == 200, (name, i, o)
        body = o["response"]["body"]
        assert body["object"] == "text_completion", (name, i, body)
        choice = body["choices"][0]
        assert choice["token_ids"] == g["greedy_token_ids"], (
            f"{name} golden-{i}: tokens differ\n got  {choice['token_ids']}\n want "
            f"{g['greedy_token_ids']}")
        assert choice["text"] == g["greedy_text"], (
            f"{name} golden-{i}: text differs\n got  {choice['text']!r}\n want {g['greedy_text']!r}")
        assert choice["finish_reason"] == "length", (name, i, choice["finish_reason"])
        assert body["usage"] == {"prompt_tokens": len(g["prompt_token_ids"]),
                                 "completion_tokens": len(g["greedy_token_ids"]),
                                 "total_tokens": len(g["prompt_token_ids"]) +
                                 len(g["greedy_token_ids"])}, (name, i, body["usage"])
    chat, as_text = outputs[8], outputs[9]
    assert chat["error"] is None and chat["response"]["status_code"] == 200, (name, chat)
    body = chat["response"]["body"]
    assert body["object"] == "chat.completion", (name, body)
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == 8, (name, choice)
    assert body["usage"]["prompt_tokens"] == CHAT_PROMPT_TOKENS, (name, body["usage"])
    # The chat line ran on the Mistral layout's tokens: the same as the laid-out text's.
    text_choice = as_text["response"]["body"]["choices"][0]
    assert as_text["response"]["body"]["usage"]["prompt_tokens"] == CHAT_PROMPT_TOKENS
    assert choice["token_ids"] == text_choice["token_ids"], (name, choice, text_choice)
    assert choice["message"]["content"] == text_choice["text"], (name, choice, text_choice)


def copy_fixture(fixtures, name, dest):
    """A copy of a fixture directory: weights symlinked, the small files copied, no golden."""
    dest.mkdir()
    for f in (fixtures / name).iterdir():
        if f.name.endswith(".safetensors"):
            (dest / f.name).symlink_to(f)
        elif f.name != "golden.jsonl":
            shutil.copy(f, dest / f.name)
    return dest


def edit_config(model, **changes):
    path = model / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2))


def small_bpe(vocab_size):
    """A tokenizer.json BPE model with `vocab_size` tokens (<unk>, <s>, </s>, then t3, t4, ...)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"t{i}": i for i in range(3, vocab_size)})
    return json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": []}})


def bad_models(fixtures, tmp):
    """(name, model dir, words the message must hold), each a copy of a fixture with one fault."""
    cases = []

    def case(label, fixture, words):
        model = copy_fixture(fixtures, fixture, Path(tmp, label))
        cases.append((label, model, words))
        return model

    m = case("model-type-gpt-neox", "tiny-llama", [])
    edit_config(m, model_type="gpt_neox")
    cases[-1][2].extend([f"{m}/config.json", 'key "model_type" is "gpt_neox"',
                         "which moebatch does not run", "it runs " + ", ".join(SUPPORTED)])
    m = case("architecture-unknown", "tiny-llama", [])
    edit_config(m, model_type=None, architectures=["GPTNeoXForCausalLM"])
    cases[-1][2].extend([f"{m}/config.json", "unknown architecture", "GPTNeoXForCausalLM",
                         ", ".join(SUPPORTED)])
    m = case("top-k-above-experts", "tiny-qwen3-moe", [])
    edit_config(m, num_experts_per_tok=40)
    cases[-1][2].extend([f"{m}/config.json", 'key "num_experts_per_tok" (40)',
                         "exceeds the number of experts (32)"])
    m = case("heads-not-multiple-of-kv-heads", "tiny-llama", [])
    edit_config(m, num_key_value_heads=4)
    cases[-1][2].extend([f"{m}/config.json", 'key "num_key_value_heads" must divide '
                         "num_attention_heads", "6 heads, 4 KV heads"])
    m = case("no-experts-sharded-f16", "tiny-olmoe", [])
    edit_config(m, num_experts=0)
    cases[-1][2].extend([f"{m}/config.json", 'key "num_experts" must be positive, got 0'])
    m = case("weights-of-another-shape", "tiny-qwen2", [])
    edit_config(m, intermediate_size=90)
    cases[-1][2].extend([f"{m}/model.safetensors",
                         'tensor "model.layers.0.mlp.gate_proj.weight": wrong shape: '
                         "expected [90, 60], found [88, 60]"])
    # A truncated tokenizer.json in place of tokenizer.model.
    m = case("tokenizer-json-truncated", "tiny-qwen3", [])
    (m / "tokenizer.model").unlink()
    (m / "tokenizer.json").write_text(small_bpe(40)[:200])
    cases[-1][2].extend([f"{m}/tokenizer.json: not valid JSON", "parse error at line 1"])
    # Beside a good tokenizer.model: tokenizer.json is preferred, so it is still refused.
    m = case("tokenizer-json-truncated-beside-model", "tiny-qwen3", [])
    (m / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {')
    cases[-1][2].extend([f"{m}/tokenizer.json: not valid JSON"])
    m = case("tokenizer-json-wordpiece", "tiny-qwen3", [])
    (m / "tokenizer.model").unlink()
    (m / "tokenizer.json").write_text('{"model": {"type": "WordPiece", "vocab": {"a": 0}}}')
    cases[-1][2].extend([f"{m}/tokenizer.json: model.type: 'WordPiece' is not supported",
                         "BPE"])
    m = case("tokenizer-config-chat-template-number", "tiny-qwen3", [])
    (m / "tokenizer.model").unlink()
    (m / "tokenizer.json").write_text(small_bpe(40))
    (m / "tokenizer_config.json").write_text('{"chat_template": 42}')
    cases[-1][2].extend([f"{m}/tokenizer_config.json: chat_template: expected a string or a list"])
    m = case("tokenizer-larger-than-vocab", "tiny-qwen3", [])
    (m / "tokenizer.model").unlink()
    (m / "tokenizer.json").write_text(small_bpe(32001))
    cases[-1][2].extend([f"{m}/tokenizer.json has 32001 tokens but {m}/config.json vocab_size is "
                         "32000"])
    m = case("no-tokenizer", "tiny-qwen3", [])
    (m / "tokenizer.model").unlink()
    cases[-1][2].extend([f"no tokenizer in {m}: expected tokenizer.json", "tokenizer.model"])
    return cases


def check_bad_models(runner, fixtures, tmp):
    line = completion("a", [1, 2, 3], 2)
    for label, model, words in bad_models(fixtures, tmp):
        proc, outputs = run(runner, model, [line], Path(tmp))
        assert proc.returncode == 1, (label, proc.returncode, proc.stderr[-2000:])
        assert outputs is None, (label, "an output file was written")
        last = [l for l in proc.stderr.splitlines() if l.strip()][-1]
        assert last.startswith("moebatch-run: cannot load model: "), (label, proc.stderr[-2000:])
        for w in words:
            assert w in last, (label, w, last)
        print(f"  refused {label}: {last[len('moebatch-run: cannot load model: '):][:150]}")


def main() -> int:
    runner, fixtures = sys.argv[1], Path(sys.argv[2]).resolve()
    for name in FAMILIES:
        start = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            check_family(runner, fixtures, name, tmp)
        print(f"{name}: 8 golden prompts x 32 tokens identical, chat line ok "
              f"({time.time() - start:.1f} s)")
    with tempfile.TemporaryDirectory() as tmp:
        check_bad_models(runner, fixtures, tmp)
    print(f"runner families test: {len(FAMILIES)} families ok, bad model directories refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
