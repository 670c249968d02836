#!/usr/bin/env bash
# moebatch's cpu backend against llama.cpp on the same GGUF files, threads and workload, in one
# run, each pair of measurements back to back:
#   - the Mixtral-shaped 1.28 B model of bench/make_mixtral_gguf.py (random weights) as bf16,
#     Q8_0 and Q4_K_M GGUF, and
#   - the real SmolLM2-135M-Instruct Q4_1 GGUF (scripts/fetch_smollm2.sh),
# each on the workloads B x (PP + TG) of issue 29: 1 x (128 + 64), 64 x (128 + 128) and
# 64 x (512 + 16) by default: an offline batch of B independent sequences, each with its own
# PP-token prompt and TG generated tokens.
#
# llama.cpp (built by scripts/fetch_llama_cpp.sh): llama-batched-bench -npp PP -ntg TG -npl B
# (no -pps, no -tgs: all prompts prefilled, then the B sequences decoded together, one token each
# per step), -c = B * (PP + TG), -b 2048 -ub 512, flash attention "auto" (on, on the CPU
# backend), weights mmapped and warmed up by the tool. Its decode tok/s is S_TG = B*TG / T_TG and
# its total tok/s S = B*(PP+TG) / T.
#
# moebatch: bench_engine_throughput --model FILE.gguf --batch B --prompt_tokens PP --gen_tokens
# TG (compute dtype bf16 for the bf16 file where the CPU has AVX512-BF16, f32 otherwise). Its
# decode tok/s is the forward's: B sequences, one token each per pass, context growing from PP,
# logits for every row (what llama-batched-bench's decode does); its total tok/s is the whole
# engine (scheduler, greedy sampling, detokenization) on a job of B requests of PP prompt and TG
# generated tokens (ignore_eos), prompt + generated tokens over the job's time.
#
# The memory bound of decode: the bytes a decode pass reads (the weights of the layers, the
# experts its tokens touch, the lm_head, and the KV cache; bench/engine_throughput.cc PassBytes)
# over the STREAM triad bandwidth (bench_attention_bandwidth, all threads; see measure_triad).
#
# Prints one table and writes the raw results (llama.cpp's JSONL lines, moebatch's JSON) to
# .deps/bench-results/cpu_vs_llama_cpp.jsonl. Run it on an idle host: both sides share 2 cores.
#
# Usage: bench/cpu_vs_llama_cpp.sh [THREADS [FORMAT...]]
#        THREADS default 2; FORMAT among bf16 q8_0 q8_0-int8 q8_0-f32 q4_k_m smollm2 (default:
#        bf16 q8_0 q4_k_m smollm2; q8_0 runs moebatch's default --q8_0_activations=auto, the
#        host's path; q8_0-int8 and q8_0-f32 the Q8_0 file with the flag pinned)
#        env: MOEBATCH_DEPS_DIR (default .deps), MOEBATCH_BUILD_DIR (default build),
#             PYTHON_FIXTURES (the python that runs bench/make_mixtral_gguf.py; default: the
#               venv .deps/venv-hf of scripts/pinned_venv.sh, made when missing),
#             WORKLOADS (default "1:128:64 64:128:128 64:512:16", each B:PP:TG),
#             BATCHES (instead of WORKLOADS: "B ..." with PP = TG = 128),
#             REPEATS (default 1): pairs of runs per workload, llama.cpp and moebatch alternated;
#               the table then gives each side's median and the ratio of the medians, and the
#               range of the pairs' own ratios (a VM whose speed drifts by a fifth between
#               identical runs needs 3 or more)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
build="${MOEBATCH_BUILD_DIR:-$root/build}"
threads="${1:-2}"
shift || true
formats=("$@")
[ ${#formats[@]} -gt 0 ] || formats=(bf16 q8_0 q4_k_m smollm2)
if [ -n "${BATCHES:-}" ]; then
  workloads=()
  for b in $BATCHES; do workloads+=("$b:128:128"); done
else
  read -r -a workloads <<< "${WORKLOADS:-1:128:64 64:128:128 64:512:16}"
fi
for w in "${workloads[@]}"; do
  [[ "$w" =~ ^[1-9][0-9]*:[1-9][0-9]*:[1-9][0-9]*$ ]] ||
    { echo "bad workload '$w' (want B:PP:TG, e.g. 64:512:16)" >&2; exit 2; }
done
py="${PYTHON_FIXTURES:-}"
repeats="${REPEATS:-1}"
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "bad REPEATS '$repeats' (want a positive count)" >&2; exit 2; }

bash "$root/scripts/fetch_llama_cpp.sh" > /dev/null
llama="$deps/llama.cpp/bin/llama-batched-bench"
moebatch="$build/bench/bench_engine_throughput"
[ -x "$moebatch" ] || { echo "no $moebatch: build moebatch first" >&2; exit 1; }
need_mixtral=0
for f in "${formats[@]}"; do [ "$f" = smollm2 ] || need_mixtral=1; done
if [ $need_mixtral = 1 ]; then
  if [ -z "$py" ]; then
    . "$root/scripts/pinned_venv.sh"
    pinned_venv "$deps/venv-hf" "${HF_VENV_PACKAGES[@]}"
    py="$deps/venv-hf/bin/python"
  fi
  "$py" "$root/bench/make_mixtral_gguf.py" > /dev/null
fi
if [[ " ${formats[*]} " = *" smollm2 "* ]]; then bash "$root/scripts/fetch_smollm2.sh" > /dev/null; fi

results="$deps/bench-results"
mkdir -p "$results"
jsonl="$results/cpu_vs_llama_cpp.jsonl"
: > "$jsonl"
cpu="$(lscpu | sed -n 's/^Model name: *//p')"
version="$("$llama" --version 2>&1 | sed -n 's/^version: //p')"
bf16_compute=f32
grep -qw avx512_bf16 /proc/cpuinfo && bf16_compute=bf16
# The triad is measured again before each model (the VM's bandwidth drifts); the highest reading
# so far is the one the bound uses, the conservative choice.
triad=0
measure_triad() {
  local t
  t="$(OMP_NUM_THREADS=$threads "$build/bench/bench_attention_bandwidth" --shapes= |
    sed -n "s/^triad $threads thread(s), [^:]*: \([0-9.]*\) GB\/s best.*/\1/p")"
  [ -n "$t" ] || { echo "could not measure the triad bandwidth" >&2; exit 1; }
  triad="$(python3 -c "print(max($triad, $t))")"
}
measure_triad
echo "$cpu, $threads threads; llama.cpp $version; triad $triad GB/s at the start;" \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-20s | %-15s | %-21s | %-21s | %-21s | %-14s | %-9s |\n' model "B x (PP + TG)" \
  "decode tok/s llama/mb" "total tok/s llama/mb" "prefill t/s llama/mb" "decode / bound" \
  "RSS GiB"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' "----------------------" "-----------------" "-----------------------" \
  "-----------------------" "-----------------------" "----------------" "-----------"
for f in "${formats[@]}"; do
  compute=f32
  q8_0_activations=auto
  case "$f" in
    smollm2) model="$deps/models/SmolLM2-135M-Instruct.Q4_1.gguf"; label="SmolLM2-135M Q4_1" ;;
    bf16) model="$deps/bench-models/mixtral-1.3b-$f.gguf"; label="Mixtral-1.28B $f"
          compute=$bf16_compute ;;
    q8_0-f32|q8_0-int8) model="$deps/bench-models/mixtral-1.3b-q8_0.gguf"
              q8_0_activations=${f#q8_0-}; label="Mixtral-1.28B q8_0 $q8_0_activations x" ;;
    *) model="$deps/bench-models/mixtral-1.3b-$f.gguf"; label="Mixtral-1.28B $f" ;;
  esac
  measure_triad
  for w in "${workloads[@]}"; do
    IFS=: read -r npl pp tg <<< "$w"
    ctx=$(( npl * (pp + tg) ))
    pairs=()
    for rep in $(seq "$repeats"); do
      log="$results/batched-bench-$f-b$npl-p$pp-g$tg-r$rep.log"
      "$llama" -m "$model" -t "$threads" -c "$ctx" -b 2048 -ub 512 -npp "$pp" -ntg "$tg" \
        -npl "$npl" --output-format jsonl > "$log" 2>&1 ||
        { echo "llama-batched-bench failed on $f, $w (log: $log)" >&2; tail -5 "$log" >&2
          exit 1; }
      mlog="$results/moebatch-$f-b$npl-p$pp-g$tg-r$rep.log"
      mjson="$results/moebatch-$f-b$npl-p$pp-g$tg-r$rep.json"
      OMP_NUM_THREADS=$threads "$moebatch" --model "$model" --batch "$npl" --prompt_tokens "$pp" \
        --gen_tokens "$tg" --reps 1 --compute_dtype "$compute" --mem_gbs "$triad" \
        --q8_0_activations "$q8_0_activations" \
        --json_out "$mjson" > "$mlog" 2>&1 ||
        { echo "bench_engine_throughput failed on $f, $w (log: $mlog)" >&2
          tail -5 "$mlog" >&2; exit 1; }
      pairs+=("$log" "$mjson")
    done
    python3 - "$label" "$f" "$cpu" "$(cut -d' ' -f1-3 /proc/loadavg)" "$jsonl" "${pairs[@]}" \
      <<'PY'
import json, statistics, sys
label, fmt, cpu, load, out = sys.argv[1:6]
runs = []  # (llama.cpp's JSONL line, moebatch's JSON), one per pair of runs
files = sys.argv[6:]
for log, mjson in zip(files[0::2], files[1::2]):
    with open(log) as f:
        llama = json.loads([l for l in f if l.startswith('{"n_kv_max"')][-1])
    with open(mjson) as f:
        runs.append((llama, json.load(f)))
def pair(lkey, mkey):
    a = statistics.median(l[lkey] for l, _ in runs)
    b = statistics.median(m[mkey] for _, m in runs)
    cell = "%8.1f / %8.1f %4.2fx" % (a, b, b / a)
    if len(runs) > 1:
        ratios = [m[mkey] / l[lkey] for l, m in runs]
        cell += " (%.2f-%.2f)" % (min(ratios), max(ratios))
    return cell
llama0 = runs[0][0]
workload = "%d x (%d + %d)" % (llama0["pl"], llama0["pp"], llama0["tg"])
med = lambda key: statistics.median(m[key] for _, m in runs)
print("| %-20s | %-15s | %s | %s | %s | %6.1f / %6.1f | %9.2f |" % (
    label, workload, pair("speed_tg", "decode_tokens_per_s"),
    pair("speed", "engine_total_tokens_per_s"), pair("speed_pp", "prefill_tokens_per_s"),
    med("decode_tokens_per_s"), med("decode_bound_tokens_per_s"),
    max(m["peak_rss_bytes"] for _, m in runs) / 2**30))
with open(out, "a") as f:
    for llama, mb in runs:
        f.write(json.dumps({"format": fmt, "cpu": cpu, "loadavg": load, "llama_cpp": llama,
                            "moebatch": mb}) + "\n")
PY
  done
done
echo "(llama / mb = llama.cpp / moebatch, then moebatch's ratio to llama.cpp; with REPEATS > 1"
echo " each side's median over $repeats alternated pairs, then the range of the pairs' ratios;"
echo " decode / bound ="
echo " moebatch's decode tok/s / the bound of its decode passes at the highest triad seen by then;"
echo " the highest triad of the run: $triad GB/s; raw: $jsonl)"
