#!/usr/bin/env python3
"""Rewrites a CUDA source file (.cu) into C++ that the CUDA emulator runs on the host.

Two rewrites, both of syntax only C++ lacks; everything else compiles as is under the prelude
tests/cuda_emulation/cuda_emulation.h, which is force-included first:

  Kernel<T><<<grid, block, shmem, stream>>>(args)
      -> ::moebatch::cuda_emulation::Launch(&Kernel<T>, "Kernel<T>", grid, block, shmem, stream)(args)
  extern __shared__ float name[];
      -> float* const name = ::moebatch::cuda_emulation::DynamicShared<float>();

A '#line' directive keeps compiler messages pointing at the .cu file. Fails (exit 1) when a '<<<'
or 'extern __shared__' is left that the patterns did not match, so a new construct cannot slip
through untranslated.

Usage: translate_cu.py INPUT.cu OUTPUT.cc
"""
import re
import sys

LAUNCH = re.compile(
    r"(?P<kernel>[A-Za-z_][\w:]*(?:\s*<[^<>;(){}]*>)?)\s*<<<(?P<config>.*?)>>>\s*\(", re.DOTALL)
DYNAMIC_SHARED = re.compile(
    r"extern\s+__shared__\s+(?P<type>[\w:]+)\s+(?P<name>\w+)\s*\[\s*\]\s*;")


def translate(text: str) -> str:
    def launch(m: re.Match) -> str:
        config = m.group("config")
        # Keep the line count: the newlines inside the match go after the rewritten call's head.
        newlines = m.group(0).count("\n")
        kernel = " ".join(m.group("kernel").split())
        head = (f"::moebatch::cuda_emulation::Launch(&{kernel}, \"{kernel}\", "
                f"{' '.join(config.split())})(")
        return head + "\n" * newlines

    text = LAUNCH.sub(launch, text)
    text = DYNAMIC_SHARED.sub(
        lambda m: f"{m.group('type')}* const {m.group('name')} = "
        f"::moebatch::cuda_emulation::DynamicShared<{m.group('type')}>();", text)
    for bad in ("<<<", "extern __shared__"):
        if bad in text:
            line = text[: text.index(bad)].count("\n") + 1
            raise SystemExit(f"translate_cu.py: untranslated '{bad}' at line {line}")
    return text


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    out = f'#line 1 "{src}"\n' + translate(text)
    with open(dst, "w", encoding="utf-8") as f:
        f.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
