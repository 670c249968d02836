#!/usr/bin/env python3
"""Encode throughput of moebatch's tokenizer.json tokenizer against Hugging Face `tokenizers`, one
thread each, on the same text: the 805 AlpacaEval instructions (.deps/tokenizers/bpe/texts.jsonl,
written by scripts/fetch_bpe_tokenizers.sh).

    .deps/venv-bpe/bin/python bench/tokenizer_throughput.py [--build build] [--reps 5] [NAME ...]

For each tokenizer (default: llama3 qwen2 gpt2): HF `Tokenizer.encode(text)` in a Python loop and
`Tokenizer.encode_batch_fast(texts)` with RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false
(the Rust loop, no Python per text), then bench_tokenizer_throughput (Tokenizer::Encode in C++),
each the best of --reps passes after a warm-up pass; the token counts must agree. Prints tokens/s
and our ratio to each HF figure.
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import tokenizers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def best_of(reps, fn):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        n = fn()
        best = min(best, time.perf_counter() - t0)
    return n, best


def main() -> int:
    deps = Path(os.environ.get("MOEBATCH_DEPS_DIR") or ROOT / ".deps")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", default=["llama3", "qwen2", "gpt2"])
    parser.add_argument("--build", default="build", help="build directory (default build)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--bpe-dir", type=Path, default=deps / "tokenizers" / "bpe")
    args = parser.parse_args()
    texts_file = args.bpe_dir / "texts.jsonl"
    texts = [json.loads(line) for line in texts_file.read_text(encoding="utf-8").splitlines() if line]
    binary = Path(args.build) / "bench" / "bench_tokenizer_throughput"
    if not binary.is_absolute():
        binary = ROOT / binary
    print(f"{len(texts)} texts, {sum(len(t.encode()) for t in texts)} bytes; tokenizers "
          f"{tokenizers.__version__}; one thread; best of {args.reps} passes")
    print(f"{'tokenizer':10} {'HF encode loop':>16} {'HF encode_batch_fast':>21} {'moebatch':>12} "
          f"{'vs loop':>8} {'vs batch':>9}")
    for name in args.names:
        tok = tokenizers.Tokenizer.from_file(str(args.bpe_dir / name / "tokenizer.json"))
        n_loop, t_loop = best_of(args.reps, lambda: sum(len(tok.encode(t).ids) for t in texts))
        n_batch, t_batch = best_of(args.reps, lambda: sum(len(e.ids) for e in tok.encode_batch_fast(texts)))
        out = subprocess.run([str(binary), "--tokenizer", str(args.bpe_dir / name), "--texts",
                              str(texts_file), "--reps", str(args.reps)],
                             check=True, capture_output=True, text=True).stdout
        m = re.search(r"(\d+) tokens; best pass ([0-9.]+) s", out)
        n_ours, t_ours = int(m.group(1)), float(m.group(2))
        if not n_loop == n_batch == n_ours:
            sys.exit(f"{name}: token counts differ: HF {n_loop}/{n_batch}, moebatch {n_ours}")
        ours, loop, batch = n_ours / t_ours, n_loop / t_loop, n_batch / t_batch
        print(f"{name:10} {loop:>12,.0f} t/s {batch:>17,.0f} t/s {ours:>8,.0f} t/s "
              f"{ours / loop:>7.2f}x {ours / batch:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
