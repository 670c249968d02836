#!/usr/bin/env python3
"""Prefill and decode throughput over a job, like MoE-Lens Fig. 13, from the per-pass CSV that
bench_pipeline_throughput --csv writes.

    scripts/plot_throughput.py PASSES.csv OUT.png [--title TEXT]

One panel per generation length g: prefill tokens/s and decode tokens/s of each pass (tokens of
the pass / its seconds) against the time since the job started. Needs matplotlib
(`python3 -m pip install matplotlib`); exits 1 with that hint when it is missing.
"""
import argparse
import csv
import sys
from collections import defaultdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv_path")
    parser.add_argument("png_path")
    parser.add_argument("--title", default="moebatch: throughput over the job")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_throughput: needs matplotlib (python3 -m pip install matplotlib)", file=sys.stderr)
        return 1

    jobs = defaultdict(lambda: {"t": [], "prefill": [], "decode": []})
    try:
        with open(args.csv_path, newline="") as f:
            for row in csv.DictReader(f):
                seconds = float(row["pass_seconds"])
                if seconds <= 0:
                    continue
                job = jobs[int(row["gen_tokens"])]
                job["t"].append(float(row["t_seconds"]))
                job["prefill"].append(int(row["prefill_tokens"]) / seconds)
                job["decode"].append(int(row["decode_tokens"]) / seconds)
    except (OSError, KeyError, ValueError) as e:
        print(f"plot_throughput: {args.csv_path}: {e}", file=sys.stderr)
        return 1
    if not jobs:
        print(f"plot_throughput: {args.csv_path} has no passes", file=sys.stderr)
        return 1

    fig, axes = plt.subplots(len(jobs), 1, figsize=(8, 2.6 * len(jobs)), squeeze=False)
    for ax, (g, job) in zip(axes[:, 0], sorted(jobs.items())):
        ax.plot(job["t"], job["prefill"], label="prefill tokens/s", linewidth=1)
        ax.plot(job["t"], job["decode"], label="decode tokens/s", linewidth=1)
        ax.set_title(f"generation length {g}")
        ax.set_xlabel("seconds since the job started")
        ax.set_ylabel("tokens/s")
        ax.legend(loc="upper right")
        ax.grid(alpha=0.3)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.png_path, dpi=120)
    print(f"plot_throughput: wrote {args.png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
