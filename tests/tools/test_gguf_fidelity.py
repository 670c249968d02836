#!/usr/bin/env python3
"""moebatch on a real GGUF file against llama.cpp on the same file (run by ctest; plain python3).

The model is SmolLM2-135M-Instruct Q4_1 (scripts/fetch_smollm2.sh); the reference is
tests/fixtures/smollm2-reference/ (tests/fixtures/make_smollm2_reference.py: llama-cpp-python
0.3.36, 2 threads, the same file).

1. Greedy tokens: the reference's 16 chat prompts, given as llama.cpp's prompt token ids (completion
   lines, temperature 0, ignore_eos, 32 tokens), through moebatch-run. Two implementations of the
   same quantized model round differently (llama.cpp's Q8_1 activations, f16 KV cache and flash
   attention; moebatch's int8 activations and f32 attention): measured, their logits differ by up
   to ~0.4 (first differences at llama.cpp margins up to 0.29 on an AVX-512 Xeon, 0.374 on an AVX2
   AMD EPYC, whose kernels sum in other orders). So a prompt's tokens must be llama.cpp's up to its first difference, and that
   difference must be llama.cpp's runner-up token at a step whose top-2 logits llama.cpp found
   nearer than NEAR_TIE (after it the two continue from different texts). The same prompts as chat
   lines (messages laid out by the GGUF's chat template and tokenizer) must give llama.cpp's
   prompt ids (their count) and the same tokens.
2. Perplexity over the first CHUNKS chunks of 512 tokens of the reference's text (KJV Genesis;
   llama.cpp's own tokens, ppl_tokens.npy), scored as llama-perplexity does (moebatch-perplexity):
   within 1% of llama.cpp's perplexity over the same chunks (its per-chunk NLL sums).

Usage: test_gguf_fidelity.py MOEBATCH_RUN MOEBATCH_PERPLEXITY REFERENCE_DIR MODEL
           [--chunks N (default 8; the reference has 98)] [--perplexity_only]
           [--engine_flag=FLAG ...] (each passed to both programs; ctest runs
           --q8_0_activations=int8, llama.cpp's method for the file's Q8_0 tensor, the tied
           embedding and lm_head, and --q8_0_activations=f32, which widens it exactly with f32
           activations: the default on CPUs without VNNI)
"""
import argparse
import ast
import json
import math
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

NEAR_TIE = 0.45  # logits
CHUNKS = 8  # ctest's default: 2,040 tokens scored in ~10 s; --chunks 98 scores all 24,990


def read_npy_int32(path):
    data = Path(path).read_bytes()
    assert data[:6] == b"\x93NUMPY", f"{path}: not a .npy file"
    header_len = struct.unpack("<H", data[8:10])[0]
    header = ast.literal_eval(data[10:10 + header_len].decode("latin1"))
    assert header["descr"] == "<i4" and not header["fortran_order"], header
    (n,) = header["shape"]
    return list(struct.unpack(f"<{n}i", data[10 + header_len:10 + header_len + 4 * n]))


def run_lines(runner, model, lines, tmp, flags):
    inp, out = Path(tmp, "in.jsonl"), Path(tmp, "out.jsonl")
    inp.write_text("".join(json.dumps(l) + "\n" for l in lines))
    proc = subprocess.run([runner, "--model", model, "--input", str(inp), "--output", str(out),
                           "--progress=false", "--kv_cache_gb", "0.25", *flags],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}


def greedy(runner, model, ref, tmp, flags):
    cases = ref["generation"]["cases"]
    n = ref["generation"]["n_tokens"]
    completion = [{"custom_id": f"ids{i}", "method": "POST", "url": "/v1/completions",
                   "body": {"prompt": c["prompt_ids"], "max_tokens": n, "temperature": 0,
                            "ignore_eos": True}} for i, c in enumerate(cases)]
    chat = [{"custom_id": f"chat{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": c["messages"], "max_tokens": n, "temperature": 0,
                      "ignore_eos": True}} for i, c in enumerate(cases)]
    out = run_lines(runner, model, completion + chat, tmp, flags)
    compared = agreeing = identical = 0
    diverged_margins = []
    for i, c in enumerate(cases):
        got = out[f"ids{i}"]["response"]["body"]["choices"][0]["token_ids"]
        want, margins = c["generated_ids"], c["top2_margin"]
        step = next((s for s in range(len(want)) if got[s] != want[s]), None)
        assert step is None or (got[step] == c["runner_up_ids"][step] and
                                margins[step] < NEAR_TIE), (
            f"prompt {i} {c['messages']}: moebatch {got} llama.cpp {want}: step {step} "
            f"differs at llama.cpp's top-2 margin {margins[step] if step is not None else 0}")
        diverged_margins.append(None if step is None else margins[step])
        compared += len(want)
        agreeing += sum(a == b for a, b in zip(got, want))
        identical += got == want
        body = out[f"chat{i}"]["response"]["body"]
        assert body["usage"]["prompt_tokens"] == len(c["prompt_ids"]), (i, body["usage"])
        assert body["choices"][0]["token_ids"] == got, f"prompt {i}: chat and ids differ"
    print(f"greedy: {identical}/{len(cases)} prompts identical to llama.cpp over {n} tokens, "
          f"{agreeing}/{compared} tokens at the same step; the others leave llama.cpp's tokens "
          f"for its runner-up at top-2 margins "
          f"{sorted(round(m, 3) for m in diverged_margins if m is not None)}")


def perplexity_against_llama_cpp(perplexity, model, ref_dir, ref, chunks, tmp, flags):
    tokens = read_npy_int32(Path(ref_dir, ref["perplexity"]["token_ids_file"]))
    ctx = ref["perplexity"]["n_ctx"]
    Path(tmp, "tokens.json").write_text(json.dumps(tokens[:chunks * ctx]))
    proc = subprocess.run([perplexity, "--model", model, "--tokens", str(Path(tmp, "tokens.json")),
                           "--ctx", str(ctx), "--chunks", str(chunks), "--kv_cache_gb", "0.25",
                           "--json", str(Path(tmp, "ppl.json")), *flags],
                          capture_output=True, text=True, timeout=60 + 30 * chunks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = json.loads(Path(tmp, "ppl.json").read_text())
    llama = ref["perplexity"]["llama_cpp_python"]["chunk_nll_sums"][:chunks]
    scored = chunks * (ctx - 1 - ctx // 2)
    assert ours["tokens_scored"] == scored, ours
    ppl_llama = math.exp(sum(llama) / scored)
    ratio = ours["ppl"] / ppl_llama
    print(f"perplexity over {chunks} chunks of {ctx} ({scored} tokens scored): moebatch "
          f"{ours['ppl']:.4f}, llama.cpp {ppl_llama:.4f}, ratio {ratio:.4f}")
    assert abs(ratio - 1) < 0.01, ratio


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runner", help="moebatch-run")
    parser.add_argument("perplexity", help="moebatch-perplexity")
    parser.add_argument("ref_dir", help="tests/fixtures/smollm2-reference")
    parser.add_argument("model", help="SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--chunks", type=int, default=CHUNKS, help="perplexity chunks of 512")
    parser.add_argument("--perplexity_only", action="store_true", help="skip the greedy tokens")
    parser.add_argument("--engine_flag", action="append", default=[],
                        help="a flag for both programs, e.g. --engine_flag=--q8_0_activations=f32")
    args = parser.parse_args()
    ref = json.loads(Path(args.ref_dir, "reference.json").read_text())
    if not 1 <= args.chunks <= ref["perplexity"]["n_chunks"]:
        parser.error(f"--chunks must be in [1, {ref['perplexity']['n_chunks']}]")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.perplexity_only:
            greedy(args.runner, args.model, ref, tmp, args.engine_flag)
        perplexity_against_llama_cpp(args.perplexity, args.model, args.ref_dir, ref, args.chunks,
                                     tmp, args.engine_flag)
    print("ok")


if __name__ == "__main__":
    main()
