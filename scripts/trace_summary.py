#!/usr/bin/env python3
"""Where a job's time goes, from the Chrome trace of `moebatch-run --trace_file` (or moebatchd's
`trace_file`): the passes grouped by size, each group's share of the passes' time, its split into
the device tasks (task A: norms, q/k/v/o projections; task B: router and experts; the lm_head),
the CPU task (K/V append and attention) and the rest of the pass (embedding, sampling inputs,
scheduling inside the pass), and the roofline the engine put on each pass (engine/plan/
cpu_roofline.h: the bound and the bound's share of the pass's time).

Usage: scripts/trace_summary.py TRACE.json [--groups 1,64,512]
  --groups: upper bounds of the pass-size groups, in tokens (a pass of t tokens falls in the first
  group whose bound is >= t; one more group takes the rest). Default: 1,64,511.
Prints a Markdown table. Exit status 2 with a message when the file is not such a trace.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

DEVICE_ROW, CPU_ROW, PASS_ROW = 1, 2, 3


def category(event: dict) -> str:
    if event["tid"] == CPU_ROW:
        return "attention (CPU)"
    name = event["name"]
    if name.startswith("A") and name[1:].isdigit():
        return "task A"
    if name.startswith("B") and name[1:].isdigit():
        return "task B"
    return name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--groups", default="1,64,511")
    args = parser.parse_args()
    try:
        bounds = sorted(int(g) for g in args.groups.split(",") if g)
    except ValueError:
        print(f"--groups: want comma-separated token counts, got {args.groups!r}", file=sys.stderr)
        return 2
    try:
        with open(args.trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{args.trace}: not a Chrome trace with traceEvents ({e})", file=sys.stderr)
        return 2
    spans = [e for e in events if e.get("ph") == "X"]
    passes = sorted((e for e in spans if e["tid"] == PASS_ROW), key=lambda e: e["ts"])
    work = sorted((e for e in spans if e["tid"] in (DEVICE_ROW, CPU_ROW)), key=lambda e: e["ts"])
    if not passes:
        print(f"{args.trace}: no pass events", file=sys.stderr)
        return 2

    def group_of(tokens: int) -> str:
        low = 1
        for b in bounds:
            if tokens <= b:
                return f"{low}-{b}" if low != b else f"{b}"
            low = b + 1
        return f">= {low}"

    groups: dict[str, dict] = defaultdict(
        lambda: {"passes": 0, "tokens": 0, "us": 0, "parts": defaultdict(int), "bound_us": 0.0,
                 "bounds": defaultdict(int)})
    i = 0
    for p in passes:
        start, end = p["ts"], p["ts"] + p["dur"]
        a = p.get("args", {})
        tokens = int(a.get("tokens", 0))
        g = groups[group_of(tokens)]
        g["passes"] += 1
        g["tokens"] += tokens
        g["us"] += p["dur"]
        if "bound_ms" in a:
            g["bound_us"] += a["bound_ms"] * 1e3
            g["bounds"][a.get("bound", "?")] += 1
        while i < len(work) and work[i]["ts"] < start:
            i += 1
        j = i
        while j < len(work) and work[j]["ts"] < end:
            g["parts"][category(work[j])] += work[j]["dur"]
            j += 1
        i = j
    total = sum(g["us"] for g in groups.values())
    parts = ["task A", "task B", "attention (CPU)", "lm_head"]
    print("| passes (tokens each) | passes | tokens | seconds | share of pass time | tokens/s | "
          + " | ".join(parts) + " | rest | bound | bound / time |")
    print("|" + " --- |" * (9 + len(parts)))

    def order(name: str) -> int:
        return int(name.split("-")[0].lstrip(">= "))

    for name in sorted(groups, key=order):
        g = groups[name]
        us = g["us"]
        shares = [g["parts"].get(p, 0) / us for p in parts]
        rest = 1 - sum(shares) - sum(v for k, v in g["parts"].items() if k not in parts) / us
        bound = ", ".join(f"{k} {v}" for k, v in sorted(g["bounds"].items())) or "-"
        of_bound = f"{g['bound_us'] / us:.3g}" if g["bound_us"] else "-"
        print(f"| {name} | {g['passes']} | {g['tokens']} | {us / 1e6:.2f} | {us / total:.1%} | "
              f"{g['tokens'] / (us / 1e6):.1f} | " + " | ".join(f"{s:.1%}" for s in shares)
              + f" | {rest:.1%} | {bound} | {of_bound} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
