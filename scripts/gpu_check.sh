#!/usr/bin/env bash
# Runs the GPU checks (the cuda backend's tests, its benchmarks, the pipeline runs) on a lent GPU machine from the bundle that
# scripts/gpu_bundle.sh made here (.gpu/bundle.tar.xz; the machine cannot build the project).
# Phases, several per device call where they fit its 10 minutes:
#
#   tests        the GPU tests (test_cuda_kernels, test_cuda_backend: kernels against CPU loops, the
#                whole cuda backend against the golden fixtures, the data mover under small
#                transfers)
#   sanitize     the GPU tests under compute-sanitizer (the machine's CUDA toolkit), for what the
#                CUDA emulator cannot see (docs/architecture.md): memcheck (out-of-bounds and
#                misaligned device accesses; the kernel tests give every buffer its own cudaMalloc),
#                racecheck (shared-memory races), synccheck (barrier misuse) and initcheck (reads of
#                device memory never written) over test_cuda_kernels, and memcheck over
#                test_cuda_backend (its buffers share one arena: bounds between them are not seen)
#   bench        bench_cuda_backend for each GPU budget (raw pinned H2D, the data mover during
#                decode passes, task B against tokens per pass) and bench_attention_bandwidth on the
#                machine's CPU (its all-threads GB/s is CPU_MEM_GBS for the model)
#   pipeline     bench_pipeline_throughput for each budget and generation length, with the per-pass
#                CSV and plot (set GPU_TFLOPS and CPU_MEM_GBS from the bench phase to get the
#                MoE-Lens prediction next to each figure)
#   accelerate   the transformers + accelerate baseline on the same shape, budgets and lengths
#
# Usage (device tool, from the repository root, carry [".gpu"]):
#   bash scripts/gpu_check.sh tests sanitize bench     then   bash scripts/gpu_check.sh pipeline ...
# env: OUT (the device tool sets it), GPU_BUDGETS (GiB, default "16 24": T4 and L4 emulated by the
# memory cap only, not their compute or PCIe link: say so next to every figure), GEN_TOKENS
# (default 32,64,128,256), REQUESTS (default 2000), LAYERS (synthetic layers, default 8),
# GPU_TFLOPS, CPU_MEM_GBS, HF_REQUESTS (default 256), STEP_SECONDS (time limit per program,
# default 240), PIPELINE_SECONDS (bench_pipeline_throughput's, default 540), SANITIZE_SECONDS
# (per sanitizer run, default 150; racecheck slows kernels by 10-100x: a run stopped at its limit
# reports rc=124, inconclusive, with whatever it found before).
# Sizes: 2,000 requests of the four lengths at 8 layers are roughly 480 passes of ~23 GB of weights
# each over PCIe, several minutes: give the pipeline phase one budget per call (GPU_BUDGETS=16,
# then 24), and lower REQUESTS or GEN_TOKENS if the first call's log shows it will not fit. A
# program stopped at its limit still leaves the rows it printed in the log.
# What comes back (the device tool returns at most 8 files): gpu.txt, one log per phase
# (PHASE.log, every program's output in order), passes-NNgb.csv and throughput-NNgb.png.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
phases=("$@")
out="${OUT:-/tmp/moebatch-gpu-out}"
mkdir -p "$out"
bundle="$root/.gpu/bundle.tar.xz"
dest=/tmp/moebatch-gpu
step_seconds="${STEP_SECONDS:-240}"

[ ${#phases[@]} -gt 0 ] ||
  { echo "usage: scripts/gpu_check.sh tests|sanitize|bench|pipeline|accelerate ..." >&2; exit 2; }
for phase in "${phases[@]}"; do
  case "$phase" in tests|sanitize|bench|pipeline|accelerate) ;; *)
    echo "gpu_check: unknown phase '$phase' (tests, sanitize, bench, pipeline, accelerate)" >&2
    exit 2 ;;
  esac
done
if [ ! -f "$bundle" ]; then
  echo "gpu_check: $bundle is missing: run scripts/gpu_bundle.sh here and carry .gpu" >&2
  exit 2
fi

# --- Unpack (once per machine and bundle) and find what the machine provides. -------------------
sum="$(sha256sum "$bundle" | cut -d' ' -f1)"
if [ "$(cat "$dest/bundle.sha256" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$dest" && mkdir -p "$dest" && tar -C "$dest" -xJf "$bundle" || exit 1
  echo "$sum" > "$dest/bundle.sha256"
fi
echo "gpu_check: bundle of commit $(cat "$dest/commit"); checkout at $(git rev-parse HEAD 2>/dev/null)"

# cuBLAS from the machine's CUDA toolkit or the Python wheels beside PyTorch (the bundle carries
# the CUDA runtime); libcublasLt from the same folder as libcublas when it is there (one CUDA
# installation).
cuda_dirs=()
for name in libcublas.so.13 libcublasLt.so.13; do
  found=""
  [ ${#cuda_dirs[@]} -gt 0 ] && [ -e "${cuda_dirs[0]}/$name" ] && found="${cuda_dirs[0]}/$name"
  [ -z "$found" ] && found=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n {print $NF; exit}')
  [ -z "$found" ] && found=$(find /usr/local /usr/lib /opt -name "$name" 2>/dev/null | head -1)
  if [ -z "$found" ]; then echo "gpu_check: $name not found on this machine" >&2; exit 1; fi
  cuda_dirs+=("$(dirname "$found")")
done
echo "gpu_check: cuBLAS from ${cuda_dirs[*]}"
libpath="$dest/lib"
for d in "${cuda_dirs[@]}"; do libpath="$libpath:$d"; done
export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The machine's loader and C++ runtime, unless they are older than the build needs; then the
# bundle's glibc folder, through its own loader.
run=()
if ldd "$dest/bin/test_cuda_kernels" 2>&1 | grep -q "not found"; then
  echo "gpu_check: this machine's glibc or libstdc++ is older than the build: using the bundle's"
  run=("$dest/lib/glibc/ld-linux-x86-64.so.2" --library-path "$dest/lib/glibc:$libpath")
fi

# The fixtures path compiled into the tests, and the tokenizers (ignored files, in the bundle).
src="$(cat "$dest/source_dir")"
if [ "$src" != "$root" ] && [ ! -e "$src" ]; then
  mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
fi
(cd "$dest/assets" && find . -name tokenizer.model) | while read -r f; do
  cp "$dest/assets/$f" "$root/$f"
done

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 |
  tee "$out/gpu.txt"
nproc | sed 's/^/CPU cores: /' | tee -a "$out/gpu.txt"

# step NAME SECONDS PROGRAM ARGS...: runs a bundled program (or, given a path, any), its output
# here and appended to $out/$phase.log; one summary line per step at the end.
summary=()
status=0
step() {
  local name="$1" seconds="$2" prog="$3"
  shift 3
  local cmd
  if [[ "$prog" == */* ]]; then cmd=("$prog"); else cmd=("${run[@]}" "$dest/bin/$prog"); fi
  echo; echo "=== $name: $prog $*" | tee -a "$out/$phase.log"
  local start=$SECONDS
  timeout "$seconds" "${cmd[@]}" "$@" 2>&1 | tee -a "$out/$phase.log"
  local rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-9s %-26s rc=%-3d %4ds' "$phase" "$name" "$rc" $((SECONDS - start)))")
  [ "$rc" -eq 0 ] || status=1
}

python="$(command -v python3)"
IFS=, read -ra gens <<< "${GEN_TOKENS:-32,64,128,256}"
for phase in "${phases[@]}"; do
  : > "$out/$phase.log"
  case "$phase" in
    tests)
      # gpu_catch_main exits 77 (skip) without a usable GPU: here that is a failure too.
      step test_cuda_kernels "$step_seconds" test_cuda_kernels --durations yes
      step test_cuda_backend "$step_seconds" test_cuda_backend --durations yes
      ;;
    sanitize)
      sanitizer="$(command -v compute-sanitizer ||
                   ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
      if [ -z "$sanitizer" ]; then
        echo "gpu_check: compute-sanitizer not found on this machine" | tee -a "$out/$phase.log"
        status=1
        continue
      fi
      for tool in memcheck racecheck synccheck initcheck; do
        step "kernels_$tool" "${SANITIZE_SECONDS:-150}" "$sanitizer" --tool "$tool" \
          --error-exitcode 1 "${run[@]}" "$dest/bin/test_cuda_kernels"
      done
      step backend_memcheck "${SANITIZE_SECONDS:-150}" "$sanitizer" --tool memcheck \
        --error-exitcode 1 "${run[@]}" "$dest/bin/test_cuda_backend"
      ;;
    bench)
      for gb in ${GPU_BUDGETS:-16 24}; do
        step "cuda_backend_${gb}gb" "$step_seconds" bench_cuda_backend --gpu_memory_gb "$gb"
      done
      step attention_bandwidth "$step_seconds" bench_attention_bandwidth --repeats 3 \
        --shapes 256x512
      ;;
    pipeline)
      for gb in ${GPU_BUDGETS:-16 24}; do
        step "pipeline_${gb}gb" "${PIPELINE_SECONDS:-540}" bench_pipeline_throughput \
          --model bench/models/mixtral-8x7b --weights synthetic --synthetic_layers "${LAYERS:-8}" \
          --backend cuda --gpu_memory_gb "$gb" --kv_cache_gb 64 --requests "${REQUESTS:-2000}" \
          --prompt_tokens 98 --gen_tokens "${GEN_TOKENS:-32,64,128,256}" \
          --gpu_tflops "${GPU_TFLOPS:-0}" --cpu_mem_gbs "${CPU_MEM_GBS:-80}" \
          --csv "$out/passes-${gb}gb.csv"
        step "plot_${gb}gb" 60 "$python" scripts/plot_throughput.py "$out/passes-${gb}gb.csv" \
          "$out/throughput-${gb}gb.png"
      done
      ;;
    accelerate)
      for gb in ${GPU_BUDGETS:-16 24}; do
        for g in "${gens[@]}"; do
          step "accelerate_${gb}gb_g${g}" "$step_seconds" "$python" \
            scripts/hf_accelerate_baseline.py --layers "${LAYERS:-8}" --gpu_memory_gb "$gb" \
            --requests "${HF_REQUESTS:-256}" --prompt_tokens 98 --gen_tokens "$g" --batch 64
        done
      done
      ;;
  esac
done

echo; echo "gpu_check ${phases[*]}: logs in $out"
printf '  %s\n' "${summary[@]}"
exit "$status"
