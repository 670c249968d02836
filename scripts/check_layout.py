#!/usr/bin/env python3
"""Checks the source layout (docs/architecture.md, "The map"): the include graph between folders has
no cycles, and engine/ itself holds at most 20 source files (the rest live in its subfolders).

A node is a folder that holds source files (engine/, engine/model/, cpu_attention/attention/, ...);
an edge A -> B means a file directly in A includes "B/<file>" (project includes only, the form
`#include "folder/file.h"` the code uses). Tests, benchmarks, the fuzz targets and the CUDA
emulator may include anything and are left out; a cycle among the rest is printed with the
includes that make it, and the exit status is 1.

Usage: scripts/check_layout.py [--graph]     (--graph: print every edge)
"""
import argparse
import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE_DIRS = ["engine", "cpu_attention", "cuda", "server"]
SUFFIXES = {".h", ".cc", ".cu", ".cuh"}
MAX_ENGINE_FILES = 20
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path: str) -> str:
    return str(pathlib.PurePosixPath(path).parent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="print every folder edge")
    args = parser.parse_args()

    edges = collections.defaultdict(set)  # folder -> folders
    why = {}  # (a, b) -> an example "file includes header"
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            rel = path.relative_to(ROOT).as_posix()
            src = folder_of(rel)
            for inc in INCLUDE.findall(path.read_text(errors="replace")):
                if not (ROOT / inc).is_file() or inc.split("/")[0] not in SOURCE_DIRS:
                    continue  # a library's header, or a generated one
                dst = folder_of(inc)
                if dst != src:
                    edges[src].add(dst)
                    why.setdefault((src, dst), f"{rel} includes {inc}")

    if args.graph:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{a} -> {b}")

    # Tarjan's strongly connected components; a component of more than one folder is a cycle.
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    nodes = set(edges) | {b for bs in edges.values() for b in bs}
    for v in sorted(nodes):
        if v not in index:
            visit(v)

    ok = True
    for scc in sccs:
        ok = False
        print(f"check_layout: folders in a cycle: {', '.join(scc)}")
        members = set(scc)
        for a in scc:
            for b in sorted(edges[a] & members):
                print(f"  {why[(a, b)]}")
    engine_files = sorted(p.name for p in (ROOT / "engine").iterdir()
                          if p.is_file() and p.suffix in SUFFIXES)
    if len(engine_files) > MAX_ENGINE_FILES:
        ok = False
        print(f"check_layout: {len(engine_files)} source files directly in engine/ (at most "
              f"{MAX_ENGINE_FILES}): {' '.join(engine_files)}")
    if ok:
        print(f"check_layout: ok: {len(nodes)} folders, "
              f"{sum(len(b) for b in edges.values())} folder edges, no cycle; "
              f"{len(engine_files)} source files directly in engine/")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
