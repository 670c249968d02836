#!/usr/bin/env python3
"""The `moebatch shard` driver's own cost for a large batch file, without daemons or Ray: CPU
seconds (user + system) and peak resident memory of the driver-side work, phase by phase:

  hash    the input's sha256 (the run id and the work dir's check)
  split   moebatch.shard.split_file: shard files and the manifest
  shards  per shard what the driver process does with it: read the shard file (sent to an actor),
          the Planner's assign/finish, the progress figures, writing the result lines returned
          by the actor (atomically: fsync, rename) and the state file (every 100 shards here;
          the driver writes it every 2 s)
  merge   moebatch.shard.merge_shards into one results file and one errors file

The result lines are made up here (about 530 bytes each, as a 16-token completion's output line)
and the time spent making them is not counted. What is not measured: Ray's own cost in the driver
(one remote call per shard and a status call per daemon every 0.5 s) and the actors' gRPC calls,
which run in other processes.

Usage: bench/shard_overhead.py [--requests 1000000] [--shard-requests 1000] [--servers 100]
                                 [--dir DIR]        (the client's venv: moebatch installed)
"""
import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from moebatch.shard import atomic_write, file_sha256, merge_shards, split_file
from moebatch.shard_plan import Planner, RunProgress, RunState, ServerFigures


def make_input(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"request-{i:08d}", "method": "POST",
                                "url": "/v1/chat/completions",
                                "body": {"messages": [{"role": "user",
                                                       "content": f"Summarise item {i}."}],
                                         "max_tokens": 16, "temperature": 0}}) + "\n")


def result_lines(shard_bytes: bytes) -> bytes:
    out = []
    for i, line in enumerate(shard_bytes.splitlines()):
        custom_id = json.loads(line)["custom_id"]
        out.append(json.dumps({
            "id": f"batch_req_0123456789abcdef_{i}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": f"req_0123456789abcdef_{i}",
                         "body": {"id": f"chatcmpl-0123456789abcdef_{i}",
                                  "object": "chat.completion", "created": 1767000000,
                                  "model": "mixtral",
                                  "choices": [{"index": 0, "message": {
                                      "role": "assistant",
                                      "content": "A short answer of sixteen tokens or so."},
                                      "finish_reason": "length", "logprobs": None,
                                      "token_ids": list(range(1000, 1016))}],
                                  "usage": {"prompt_tokens": 14, "completion_tokens": 16,
                                            "total_tokens": 30}}},
            "error": None}))
    return ("\n".join(out) + "\n").encode()


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--shard-requests", type=int, default=1000)
    parser.add_argument("--servers", type=int, default=100)
    parser.add_argument("--dir", help="scratch directory (default: a temporary one, removed)")
    args = parser.parse_args()
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="shard-overhead-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        source = scratch / "input.jsonl"
        make_input(source, args.requests)
        work = scratch / "work"
        (work / "results").mkdir(parents=True, exist_ok=True)
        print(f"input: {args.requests} requests, {source.stat().st_size / 2**20:.0f} MiB; "
              f"{args.servers} daemons; baseline peak RSS {peak_mib():.0f} MiB")
        phases = []

        def phase(name, started_cpu, started_wall):
            phases.append((name, cpu() - started_cpu, time.monotonic() - started_wall,
                           peak_mib()))

        c, w = cpu(), time.monotonic()
        sha = file_sha256(source)
        phase("hash", c, w)

        c, w = cpu(), time.monotonic()
        manifest = split_file(source, work / "input", max_requests=args.shard_requests)
        phase("split", c, w)
        assert manifest.source_sha256 == sha

        servers = [f"10.0.{i // 250}.{i % 250}:50051" for i in range(args.servers)]
        names = [s.name for s in manifest.shards]
        by_name = {s.name: s for s in manifest.shards}
        planner = Planner(names, servers, in_flight=3)
        state = RunState(run_id="r", source=str(source), source_sha256=sha,
                         output=str(scratch / "out.jsonl"), errors=str(scratch / "err.jsonl"),
                         servers=servers)
        progress = RunProgress(manifest.requests)
        figures = {s: ServerFigures() for s in servers}
        made = 0.0  # CPU seconds spent making result lines (not the driver's)
        c, w = cpu(), time.monotonic()
        running: list[tuple[str, str, bytes]] = []
        finished = 0
        while not planner.complete:
            for server, shard in planner.assign():
                data = (work / "input" / by_name[shard].file).read_bytes()
                running.append((server, shard, data))
                state.shards[shard] = {"server": server, "job": "", "state": "running"}
            server, shard, data = running.pop(0)
            before = cpu()
            lines = result_lines(data)
            made += cpu() - before
            atomic_write(work / "results" / f"{shard}.jsonl", lines)
            planner.finish(shard, server)
            state.shards[shard] = {"server": server, "job": "job_x", "state": "done"}
            figures[server].requests += by_name[shard].requests
            figures[server].tokens += 16 * by_name[shard].requests
            progress.update(figures, now=time.monotonic())
            finished += 1
            if finished % 100 == 0:
                state.save(work)
        state.save(work)
        phases.append(("shards", cpu() - c - made, time.monotonic() - w, peak_mib()))

        c, w = cpu(), time.monotonic()
        report = merge_shards(manifest, work / "input",
                              lambda s: [work / "results" / f"{s.name}.jsonl"],
                              scratch / "out.jsonl", scratch / "err.jsonl")
        phase("merge", c, w)
        assert report.completed == args.requests and not report.missing

        per_million = 1e6 / args.requests
        total = sum(p[1] for p in phases)
        print(f"{len(names)} shards of {args.shard_requests}; results "
              f"{(scratch / 'out.jsonl').stat().st_size / 2**20:.0f} MiB")
        print(f"{'phase':8} {'CPU s':>8} {'wall s':>8} {'peak RSS MiB':>13}")
        for name, cpu_s, wall_s, rss in phases:
            print(f"{name:8} {cpu_s:8.2f} {wall_s:8.2f} {rss:13.0f}")
        print(f"total: {total:.2f} CPU s ({total * per_million:.2f} per million requests), "
              f"peak RSS {peak_mib():.0f} MiB")
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
