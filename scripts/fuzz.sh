#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz: request validation and the checkpoint parsers; clang++
# with ASan + UBSan) in their own build directory and runs each for a bounded time on a scratch copy
# of its committed corpus (tests/fuzz/corpus/<target>/, never grown by a run). Fails (exit 1) on any
# crash, sanitizer report, failed invariant, leak, timeout (> 10 s for one input) or OOM (> 2 GiB),
# printing the reproducer's path. See tests/fuzz/README.md.
#
# Relies on what scripts/build.sh sets up (it runs these itself; both are idempotent):
# scripts/install_deps.sh (Debian -dev packages, .deps/sentencepiece) and scripts/fetch_tokenizer.sh
# (tests/fixtures/tiny-mixtral/tokenizer.model); plus clang++ with libFuzzer and libomp, which it
# installs (Debian: clang, libclang-rt-14-dev, libomp-dev) when missing. It never touches build/.
#
# Usage: scripts/fuzz.sh [TARGET ...]     (default: all five)
#   env: FUZZ_SECONDS   seconds per target (default 60)
#        FUZZ_BUILD_DIR build directory (default build-fuzz)
#        FUZZ_JOBS      targets run at once (default: the number of cores)
#        JOBS           build parallelism (default: the number of cores)
#        FUZZ_BUILD_ONLY=1  build, do not run
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${FUZZ_BUILD_DIR:-build-fuzz}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
seconds="${FUZZ_SECONDS:-60}"
all_targets=(fuzz_jsonl_request fuzz_proto_request fuzz_model_config fuzz_safetensors_header
  fuzz_safetensors_index fuzz_gguf)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

scripts/install_deps.sh
scripts/fetch_tokenizer.sh >/dev/null

# clang++ with libFuzzer's runtime, and libomp for -fopenmp under clang: link a tiny fuzzer.
have_toolchain() {
  local tmp
  tmp="$(mktemp -d)"
  echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' >"$tmp/t.cc"
  clang++ -fsanitize=fuzzer,address,undefined -fopenmp "$tmp/t.cc" -o "$tmp/t" >/dev/null 2>&1
  local rc=$?
  rm -rf "$tmp"
  return $rc
}
if ! have_toolchain; then
  echo "fuzz: installing clang, libFuzzer and libomp (apt-get)"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq clang libclang-rt-14-dev \
    libomp-dev >/dev/null
  have_toolchain || { echo "fuzz: clang++ with libFuzzer and libomp not found" >&2; exit 1; }
fi

# Configure (CUDA, tests and benchmarks off: only the fuzz targets and what they link are built).
export CCACHE_DIR="${CCACHE_DIR:-$root/.deps/ccache}"
cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 \
  -DMOEBATCH_FUZZ=ON -DMOEBATCH_ENABLE_CUDA=OFF -DMOEBATCH_BUILD_TESTS=OFF \
  -DMOEBATCH_BUILD_BENCH=OFF >/dev/null
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "$t"); done
cmake --build "$build" -j "${JOBS:-$(nproc)}" "${build_targets[@]}"
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

# Run each target on a scratch copy of its corpus; new inputs and any crash stay under
# $build/fuzz-run/<target>/.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
run_one() {
  local t="$1" dir="$build/fuzz-run/$1"
  rm -rf "$dir" && mkdir -p "$dir/corpus" "$dir/artifacts"
  if [ ! -d "$root/tests/fuzz/corpus/$t" ]; then
    echo "fuzz: no corpus tests/fuzz/corpus/$t" >"$dir/log.txt"
    echo 1 >"$dir/rc"
    return
  fi
  cp -r "$root/tests/fuzz/corpus/$t/." "$dir/corpus/"
  local dict=()
  [ -f "$root/tests/fuzz/$t.dict" ] && dict=(-dict="$root/tests/fuzz/$t.dict")
  local rc=0
  "$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/" "${dict[@]}" "$dir/corpus" \
    >"$dir/log.txt" 2>&1 || rc=$?
  echo "$rc" >"$dir/rc"
}

jobs_max="${FUZZ_JOBS:-$(nproc)}"
echo "fuzz: ${#targets[@]} target(s), ${seconds} s each, ${jobs_max} at a time; logs in $build/fuzz-run/"
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs_max" ]; then wait -n || true; running=$((running - 1)); fi
done
wait

failed=0
printf '%-26s %12s %10s %8s  %s\n' target executions exec/s corpus result
for t in "${targets[@]}"; do
  dir="$build/fuzz-run/$t"
  rc="$(cat "$dir/rc")"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log.txt" | tail -1)"
  speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log.txt" | tail -1)"
  corpus="$(find "$dir/corpus" -type f | wc -l)"
  if [ "$rc" = 0 ]; then
    printf '%-26s %12s %10s %8s  %s\n' "$t" "${execs:-?}" "${speed:-?}" "$corpus" ok
  else
    failed=1
    printf '%-26s %12s %10s %8s  %s\n' "$t" "${execs:-?}" "${speed:-?}" "$corpus" "FAILED (exit $rc)"
  fi
done
if [ "$failed" = 1 ]; then
  for t in "${targets[@]}"; do
    dir="$build/fuzz-run/$t"
    [ "$(cat "$dir/rc")" = 0 ] && continue
    echo
    echo "=== $t: last lines of $dir/log.txt"
    tail -n 40 "$dir/log.txt"
    for a in "$dir"/artifacts/*; do
      [ -f "$a" ] || continue
      echo "fuzz: reproducer: $a"
      echo "fuzz:   rerun it: $build/tests/fuzz/$t $a"
    done
  done
  exit 1
fi
echo "fuzz: ok, no crashes"
