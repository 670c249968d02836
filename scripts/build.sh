#!/usr/bin/env bash
# Installs what the build needs (scripts/install_deps.sh), fetches the tokenizer asset into the
# fixtures (scripts/fetch_tokenizer.sh), configures and builds.
#
# CUDA code: MOEBATCH_ENABLE_CUDA=ON (the default: compiled wherever nvcc is, which the test suite's
# emulated tests need), OFF, or auto: ON only where a GPU is present (/dev/nvidia0 or nvidia-smi -L
# lists one), and on a build directory configured before, whatever it was configured with. The
# demo uses auto, so a host without a GPU does not wait for nvcc.
#
# Usage: scripts/build.sh [TARGET ...]     env: BUILD_DIR (default build), JOBS (default nproc),
#                                               MOEBATCH_ENABLE_CUDA (ON, OFF or auto)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"

scripts/install_deps.sh
scripts/fetch_tokenizer.sh
export CCACHE_DIR="${CCACHE_DIR:-$root/.deps/ccache}"
cuda="${MOEBATCH_ENABLE_CUDA:-ON}"
cuda_args=()
case "$cuda" in
  ON|OFF) cuda_args=(-DMOEBATCH_ENABLE_CUDA="$cuda") ;;
  auto)
    if [ ! -f "$build/CMakeCache.txt" ]; then
      if ls /dev/nvidia[0-9]* >/dev/null 2>&1 ||
         { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
        cuda_args=(-DMOEBATCH_ENABLE_CUDA=ON)
      else
        echo "build: no GPU here: CUDA code not compiled (MOEBATCH_ENABLE_CUDA=ON compiles it)"
        cuda_args=(-DMOEBATCH_ENABLE_CUDA=OFF)
      fi
    fi ;;
  *) echo "build: MOEBATCH_ENABLE_CUDA must be ON, OFF or auto, got '$cuda'" >&2; exit 2 ;;
esac
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j "${JOBS:-$(nproc)}" "${targets[@]}"
