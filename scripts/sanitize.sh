#!/usr/bin/env bash
# The test suite under sanitizers, in builds of their own (CUDA off: nvcc takes no
# -fsanitize; the gpu tests skip anyway where there is no GPU):
#   asan  build-asan, -fsanitize=address,undefined: every unit test (ctest), then the daemon's
#         integration tests against the instrumented moebatchd. Any report fails the run.
#   tsan  build-tsan, -fsanitize=thread: the data mover (its thread and the copy engine's, on
#         std::mutex), VSLPipe's worker thread, the scheduler and engine tests, the job store from
#         several threads, the metrics endpoint's HTTP threads. Not the daemon as a whole: Debian's
#         Abseil and gRPC are not instrumented, so TSan cannot see absl::Mutex or gRPC's own
#         locking and reports every access they guard (tried: the engine worker's absl::Mutex-
#         guarded counters and gRPC's call_op_set.h came up as races). libgomp neither: OpenMP
#         runs one thread here (TSan cannot see its barriers).
#
# Usage: scripts/sanitize.sh [asan|tsan|all]     env: JOBS (default nproc)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mode="${1:-all}"
jobs="${JOBS:-$(nproc)}"
scripts/install_deps.sh
scripts/fetch_tokenizer.sh
export CCACHE_DIR="${CCACHE_DIR:-$root/.deps/ccache}"
venv="$root/.deps/venv-client"
[ -x "$venv/bin/python" ] || client/python/run_tests.sh "$venv" >/dev/null

configure() {  # DIR SANITIZERS
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEBATCH_ENABLE_CUDA=OFF \
    -DMOEBATCH_BUILD_BENCH=OFF -DMOEBATCH_SANITIZE="$2" >/dev/null
}

if [ "$mode" = asan ] || [ "$mode" = all ]; then
  configure build-asan address,undefined
  cmake --build build-asan -j "$jobs"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE gpu
  MOEBATCH_BUILD_DIR="$root/build-asan" "$venv/bin/python" -m pytest -q \
    tests/integration/test_daemon.py tests/integration/test_security.py \
    tests/integration/test_limits.py tests/integration/test_metrics.py
  echo "sanitize: asan+ubsan: no reports"
fi

if [ "$mode" = tsan ] || [ "$mode" = all ]; then
  configure build-tsan thread
  cmake --build build-tsan -j "$jobs" --target test_engine test_offload test_model test_server
  export TSAN_OPTIONS="halt_on_error=1:ignore_noninstrumented_modules=1:second_deadlock_stack=1"
  # One CPU, so one OpenMP thread (the engine sizes its team to the CPUs it may use): libgomp is
  # not instrumented, so TSan cannot see its barriers and reports every parallel region's stack
  # reads as races. Our own threads are what this run checks; they still interleave on one CPU.
  first_cpu="$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status | sed 's/[-,].*//')"
  one_cpu=(taskset -c "$first_cpu")
  "${one_cpu[@]}" build-tsan/tests/test_offload "[data_mover],[weight_slots]"
  "${one_cpu[@]}" build-tsan/tests/test_engine "[vslpipe],[device_prefill],scheduler*,engine*"
  "${one_cpu[@]}" build-tsan/tests/test_model "[weight_store]"
  "${one_cpu[@]}" build-tsan/tests/test_server "[job_store],metrics*"
  echo "sanitize: tsan: no reports"
fi
