#!/usr/bin/env bash
# Installs what the build needs (scripts/install_deps.sh), fetches the tokenizer asset into the
# fixtures (scripts/fetch_tokenizer.sh), configures and builds. CUDA code is compiled when nvcc is
# present.
#
# Usage: scripts/build.sh [TARGET ...]     env: BUILD_DIR (default build), JOBS (default nproc)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"

scripts/install_deps.sh
scripts/fetch_tokenizer.sh
export CCACHE_DIR="${CCACHE_DIR:-$root/.deps/ccache}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j "${JOBS:-$(nproc)}" "${targets[@]}"
