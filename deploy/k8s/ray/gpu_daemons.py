"""Prints the moebatchd endpoints of a KubeRay cluster (deploy/k8s/ray) for `moebatch shard
--servers`: HOST:PORT of every live Ray node that offers a GPU, comma-separated, sorted. Each GPU
worker pod of raycluster.yaml runs moebatchd beside its Ray worker, sharing the pod's network, so a
GPU node's address (the pod IP) is its daemon's host.

Waits until at least --min such nodes are alive (workers join after the head), at most --wait
seconds; exits 1 naming how many it found if they do not come.

Usage (inside the Ray cluster, e.g. in a RayJob's entrypoint):
    python gpu_daemons.py [--port 50051] [--min 1] [--wait 600]
"""
from __future__ import annotations

import argparse
import sys
import time


def endpoints(nodes: list[dict], port: int) -> list[str]:
    """HOST:PORT of the alive nodes with a GPU in `nodes` (ray.nodes()' entries), sorted, each
    host once; an IPv6 host is bracketed."""
    hosts = {n["NodeManagerAddress"] for n in nodes
             if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0}
    return [f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in sorted(hosts)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=50051, help="moebatchd's gRPC port")
    parser.add_argument("--min", type=int, default=1, help="GPU nodes to wait for")
    parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for them")
    args = parser.parse_args(argv)
    import ray  # only here: endpoints() is tested without Ray

    ray.init(address="auto", logging_level="ERROR")
    deadline = time.monotonic() + args.wait
    while True:
        found = endpoints(ray.nodes(), args.port)
        if len(found) >= args.min:
            print(",".join(found))
            return 0
        if time.monotonic() >= deadline:
            print(f"gpu_daemons: {len(found)} GPU nodes alive after {args.wait:g} s, "
                  f"fewer than --min {args.min}", file=sys.stderr)
            return 1
        time.sleep(5)


if __name__ == "__main__":
    sys.exit(main())
