#!/usr/bin/env python3
"""The latency of moebatchd's read calls under load: 64 clients (threads, each on its own
connection) call GetJob and ListJobs in a loop for --seconds while a long job commits results and
new jobs arrive; prints p50, p99 and max of each call, and the longest gap in the daemon's log.
The goal it is held to (docs/performance.md): max under 250 ms on an otherwise idle 2-core host.

    .deps/venv-client/bin/python bench/daemon_latency.py [--build build] [--seconds 60]
"""
import argparse
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_loop(addr: str, job_id: str, stop: float, interval: float) -> dict:
    """One client's GetJob (3 of 4 calls) and ListJobs (page of 50) latencies until `stop`, a call
    every `interval` seconds (0: back to back)."""
    sys.path.insert(0, str(ROOT / "client" / "python" / "src"))
    from moebatch import Client
    from moebatch.client import _CHANNEL_OPTIONS
    c = Client(addr, timeout=60, options=_CHANNEL_OPTIONS + [("grpc.use_local_subchannel_pool", 1)])
    lat = {"GetJob": [], "ListJobs": []}
    i = 0
    while time.time() < stop:
        name = "ListJobs" if i % 4 == 3 else "GetJob"
        t = time.perf_counter()
        if name == "GetJob":
            c.get_job(job_id)
        else:
            c.list_jobs_page(page_size=50)
        lat[name].append(time.perf_counter() - t)
        i += 1
        if interval > 0:
            time.sleep(max(0.0, interval - (time.perf_counter() - t)))
    c.close()
    return lat


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=str(ROOT / "build"))
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--interval", type=float, default=0.1,
                        help="seconds between one client's calls (0: back to back, which makes "
                             "the clients' own CPU the bound on a small host)")
    parser.add_argument("--daemon_env", action="append", default=[],
                        help="NAME=VALUE for the daemon's environment (repeatable)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "client" / "python" / "src"))
    from moebatch import Client  # noqa: E402
    from moebatch.client import _CHANNEL_OPTIONS  # noqa: E402

    with tempfile.TemporaryDirectory() as tmp:
        addr = f"127.0.0.1:{free_port()}"
        log = open(Path(tmp) / "moebatchd.log", "wb")
        daemon = subprocess.Popen(
            [str(Path(args.build) / "server" / "moebatchd"), "--model",
             str(ROOT / "tests" / "fixtures" / "tiny-mixtral"), "--listen", addr, "--data-dir",
             str(Path(tmp) / "data"), "--kv-cache-gb", "0.25"], stdout=log, stderr=log,
            env={**os.environ, **dict(e.split("=", 1) for e in args.daemon_env)})
        try:
            admin = Client(addr, timeout=60)
            deadline = time.time() + 60
            while True:
                try:
                    admin.list_jobs_page()
                    break
                except Exception:
                    assert daemon.poll() is None and time.time() < deadline, "moebatchd did not start"
                    time.sleep(0.2)
            # A long job whose results commit throughout, and history for ListJobs to page.
            long_job = admin.create_job(requests=[
                {"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                 "body": {"prompt": [1, 2, 3 + i % 50], "max_tokens": 64, "ignore_eos": True}}
                for i in range(20000)])
            for _ in range(200):
                admin.create_job(requests=[{"custom_id": "a", "method": "POST",
                                            "url": "/v1/completions",
                                            "body": {"prompt": [1, 2], "max_tokens": 1}}],
                                 metadata={"history": "x" * 200})
            stop = time.time() + args.seconds
            # Processes, not threads: one GIL per client, so a call's latency is the daemon's and
            # the host's, not 64 Python threads queueing for one interpreter.
            with multiprocessing.Pool(args.clients) as pool:
                parts = pool.starmap(client_loop,
                                     [(addr, long_job.id, stop, args.interval)] * args.clients)
            lat = {"GetJob": [], "ListJobs": []}
            for part in parts:
                for name, secs in part.items():
                    lat[name].extend(secs)
            done = admin.get_job(long_job.id).request_counts.completed
            admin.cancel(long_job.id)
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
        print(f"moebatchd read latency: {args.clients} clients x {args.seconds:g} s, a call every "
              f"{args.interval:g} s each, "
              f"{done} results committed meanwhile, CPU: {os.cpu_count()} cores")
        for name, secs in lat.items():
            secs.sort()
            pct = lambda q: secs[min(len(secs) - 1, int(q * len(secs)))] * 1e3  # noqa: E731
            print(f"  {name:9s} {len(secs):7d} calls  p50 {pct(0.5):7.1f} ms  "
                  f"p99 {pct(0.99):7.1f} ms  max {secs[-1] * 1e3:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
