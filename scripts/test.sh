#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (Debian packages, sentencepiece,
# the Mixtral tokenizer asset), builds everything (CUDA code too when nvcc is present), runs ctest.
#
# Usage: scripts/test.sh            env: BUILD_DIR (default build), JOBS (default nproc)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"

scripts/install_deps.sh
scripts/fetch_tokenizer.sh
export CCACHE_DIR="${CCACHE_DIR:-$root/.deps/ccache}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs"
# GPU tests carry the `gpu` label and exit 77 (skipped) where there is no device.
ctest --test-dir "$build" --output-on-failure -j "$jobs"
