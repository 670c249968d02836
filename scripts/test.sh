#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (Debian packages, sentencepiece,
# the Mixtral tokenizer asset), builds everything (CUDA code too when nvcc is present), runs ctest.
#
# Usage: scripts/test.sh            env: BUILD_DIR (default build), JOBS (default nproc)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/build.sh
# GPU tests carry the `gpu` label and exit 77 (skipped) where there is no device.
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-$(nproc)}"
