#!/usr/bin/env python3
"""moebatch-run with --backend=cuda on the CUDA emulator (run by ctest; plain python3).

The user's command on a GPU host, with the cuda backend's defaults left as they are (resident
layers sized automatically, the pipeline profiler, VSLPipe; the tokens-per-pass ceiling is set to
512 only so that the profiler's sweep is short on the emulator): every golden prompt
of the tiny Mixtral, f32 weights, greedy, must give transformers' tokens; sampled chat lines
beside them must complete. Checks the engine's start-up line names the cuda backend. The other
fixtures named (tiny-dbrx: LayerNorm, fused tensors, p-norm routing; tiny-gpt-oss-mxfp4: sinks,
sliding layers, biases, clamped SwiGLU, MXFP4 experts; tiny-deepseek-v2: multi-head latent
attention, DeepSeek's router, shared experts) run their golden prompts the same way.

Usage: test_runner_cuda.py MOEBATCH_RUN FIXTURES_DIR [FIXTURE ...]
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def check(runner, fixtures, name, chat):
    model = fixtures / name
    golden = [json.loads(line) for line in open(model / "golden.jsonl")]
    lines = []
    for i, g in enumerate(golden):
        lines.append({"custom_id": f"golden-{i}", "method": "POST", "url": "/v1/completions",
                      "body": {"prompt": g["prompt_token_ids"],
                               "max_tokens": len(g["greedy_token_ids"]),
                               "temperature": 0, "ignore_eos": True}})
    for i in range(2 if chat else 0):
        lines.append({"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"messages": [{"role": "user", "content": f"Hello number {i}"}],
                               "max_tokens": 6, "temperature": 0.7, "seed": 5 + i}})
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp, "in.jsonl"), Path(tmp, "out.jsonl")
        inp.write_text("\n".join(json.dumps(l) for l in lines) + "\n")
        proc = subprocess.run(
            [runner, "--model", str(model), "--input", str(inp), "--output", str(out),
             "--backend", "cuda", "--weights", "host", "--weight_dtype", "f32", "--gpu_memory_gb", "2",
             "--kv_cache_gb", "0.25", "--max_tokens_per_pass", "512", "--progress=false"],
            capture_output=True, text=True, timeout=800)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "cuda backend" in proc.stderr, proc.stderr[-4000:]
        outputs = [json.loads(l) for l in out.read_text().splitlines()]

    assert [o["custom_id"] for o in outputs] == [l["custom_id"] for l in lines]
    for i, g in enumerate(golden):
        o = outputs[i]
        assert o["error"] is None and o["response"]["status_code"] == 200, o
        choice = o["response"]["body"]["choices"][0]
        assert choice["token_ids"] == g["greedy_token_ids"], f"{name} golden-{i} tokens differ"
    for o in outputs[len(golden):]:
        assert o["error"] is None and o["response"]["status_code"] == 200, o
        assert o["response"]["body"]["usage"]["completion_tokens"] >= 1, o
    print(f"moebatch-run --backend=cuda (emulated), {name}: {len(golden)} golden prompts match, "
          f"{len(outputs) - len(golden)} sampled lines done")


def main() -> int:
    runner, fixtures = sys.argv[1], Path(sys.argv[2])
    check(runner, fixtures, "tiny-mixtral", chat=True)
    for name in sys.argv[3:]:
        check(runner, fixtures, name, chat=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
