#!/usr/bin/env bash
# Packs what a lent GPU machine needs to run the GPU tests and benchmarks into one
# archive, .gpu/bundle.tar.xz, to travel with the working tree (device tool: `carry: [".gpu"]`).
#
# Why: the GPU machine has CUDA (nvcc, cuBLAS), CMake and PyTorch, but none of this project's
# libraries (gRPC, protobuf, Abseil, spdlog, oneDNN) and no network, so the project cannot be built
# there. This builds the GPU programs here (scripts/build.sh: CUDA code for sm_75/89/90) and packs
# them with every shared library they load that such a machine may lack. Left out: the CUDA driver
# (libcuda) and cuBLAS (hundreds of MB; part of every CUDA toolkit, found there by
# scripts/gpu_check.sh). glibc, libstdc++ and libgcc_s go in a separate folder, used only if the
# machine's own are older than this build needs. The working tree plus the archive must stay under
# the tool's 64 MiB; the script prints both and fails above the limit.
#
# Usage: scripts/gpu_bundle.sh             env: BUILD_DIR (default build)
# Then, on the GPU machine: bash scripts/gpu_check.sh PHASE... (it says what each phase runs, how
# to fit them into the device tool's calls and what comes back).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"

programs=(tests/test_cuda_kernels tests/test_cuda_backend bench/bench_cuda_backend
          bench/bench_pipeline_throughput bench/bench_attention_bandwidth)
targets=()
for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
# (The GPU programs are targets only where CMake found nvcc: without it this fails here.)
BUILD_DIR="$build" scripts/build.sh "${targets[@]}"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/lib/glibc"
for p in "${programs[@]}"; do cp "$build/$p" "$stage/bin/"; done

# Libraries by what ldd resolves here. The machine's own loader, libc family and driver are used;
# the C++ runtime and glibc travel as a fallback only.
declare -A seen=()
for p in "${programs[@]}"; do
  while read -r name path; do
    [[ -z "$path" || "$path" == not ]] && { echo "gpu_bundle: $p: $name not found here" >&2; exit 1; }
    [[ -n "${seen[$name]:-}" ]] && continue
    seen[$name]=1
    case "$name" in
      linux-vdso.so.*|libcuda.so.*|libcublas.so.*|libcublasLt.so.*) ;;
      ld-linux-*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libstdc++.so.*|\
      libgcc_s.so.*)
        cp -L "$path" "$stage/lib/glibc/$name" ;;
      *) cp -L "$path" "$stage/lib/$name" ;;
    esac
  done < <(ldd "$build/$p" | awk '$2 == "=>" {print $1, $3} $1 ~ /^\/.*ld-linux/ {n=$1; sub(/.*\//, "", n); print n, $1}')
done

# Ignored files the programs read: the tokenizers scripts/fetch_tokenizer.sh placed (third-party,
# never committed) in the fixtures and the benchmark model directories.
while read -r f; do
  mkdir -p "$stage/assets/$(dirname "$f")"
  cp "$f" "$stage/assets/$f"
done < <(find tests/fixtures bench/models -name tokenizer.model -not -path '*/mistral-v*')

# Where the tests look for the golden fixtures (compiled in: MOEBATCH_FIXTURES_DIR); gpu_check.sh
# links that path to the checkout it runs in.
echo "$root" > "$stage/source_dir"
git rev-parse HEAD > "$stage/commit" 2>/dev/null || echo unknown > "$stage/commit"

mkdir -p .gpu
tar -C "$stage" -cJf .gpu/bundle.tar.xz .
bundle=$(stat -c %s .gpu/bundle.tar.xz)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
       awk '{s += $1} END {print s + 0}')
limit=$((64 * 1024 * 1024))
awk -v b="$bundle" -v t="$tree" -v p="${#programs[@]}" -v l="$(ls "$stage/lib" | wc -l)" 'BEGIN {
  printf "gpu_bundle: .gpu/bundle.tar.xz %.1f MiB (%d programs, %d libraries); working tree %.1f MiB;\n",
         b / 1048576, p, l, t / 1048576
  printf "  together %.1f of the 64 MiB the device tool carries\n", (b + t) / 1048576 }'
if (( bundle + tree > limit )); then
  echo "gpu_bundle: over the device tool's 64 MiB" >&2
  exit 1
fi
