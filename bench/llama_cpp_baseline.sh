#!/usr/bin/env bash
# The llama.cpp baseline moebatch's CPU throughput is compared against: llama-batched-bench (built
# by scripts/fetch_llama_cpp.sh) on
#   - the Mixtral-shaped 1.28 B model of bench/make_mixtral_gguf.py (random weights) as bf16,
#     Q8_0 and Q4_K_M GGUF, and
#   - the real SmolLM2-135M-Instruct Q4_1 GGUF (scripts/fetch_gguf_cases.sh),
# each at batch 1 (-npp 128 -ntg 128 -npl 1) and batch 64 (-npp 128 -ntg 128 -npl 64): an offline
# batch of independent sequences, each with its own 128-token prompt (no -pps), all prompts
# prefilled first, then the 64 sequences decoded together, one token each per step (no -tgs);
# -c = B * (PP + TG) so every sequence has room; default -b 2048 -ub 512 and flash attention
# "auto" (on, on the CPU backend); weights mmapped and warmed up by the tool.
#
# Prints one table: decode tok/s (S_TG = B*TG / T_TG) and total tok/s (S = B*(PP+TG) / T), plus
# the prefill speed; the raw JSONL of every run goes to
# .deps/bench-results/llama_cpp_baseline.jsonl.
#
# Usage: bench/llama_cpp_baseline.sh [THREADS [FORMAT...]]
#        THREADS default 2; FORMAT among bf16 q8_0 q4_k_m smollm2 (default: all)
#        env: MOEBATCH_DEPS_DIR (default .deps), PYTHON_FIXTURES (default .venv-fixtures/bin/python)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
threads="${1:-2}"
shift || true
formats=("$@")
[ ${#formats[@]} -gt 0 ] || formats=(bf16 q8_0 q4_k_m smollm2)
py="${PYTHON_FIXTURES:-$root/.venv-fixtures/bin/python}"

bash "$root/scripts/fetch_llama_cpp.sh" > /dev/null
bench="$deps/llama.cpp/bin/llama-batched-bench"
need_mixtral=0
for f in "${formats[@]}"; do [ "$f" = smollm2 ] || need_mixtral=1; done
if [ $need_mixtral = 1 ]; then "$py" "$root/bench/make_mixtral_gguf.py" > /dev/null; fi
if [[ " ${formats[*]} " = *" smollm2 "* ]]; then
  bash "$root/scripts/fetch_gguf_cases.sh" > /dev/null
fi

results="$deps/bench-results"
mkdir -p "$results"
jsonl="$results/llama_cpp_baseline.jsonl"
: > "$jsonl"
pp=128
tg=128
cpu="$(lscpu | sed -n 's/^Model name: *//p')"
version="$("$bench" --version 2>&1 | sed -n 's/^version: //p')"
echo "llama.cpp $version: llama-batched-bench -t $threads -npp $pp -ntg $tg, $cpu," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-22s | %3s | %11s | %12s | %11s | %9s |\n' model B "prefill t/s" "decode tok/s" \
  "total tok/s" "T total s"
printf '|%s|%s|%s|%s|%s|%s|\n' "------------------------" "-----" "-------------" \
  "--------------" "-------------" "-----------"
for f in "${formats[@]}"; do
  case "$f" in
    smollm2) model="$deps/models/SmolLM2-135M-Instruct.Q4_1.gguf"; label="SmolLM2-135M Q4_1" ;;
    *)       model="$deps/bench-models/mixtral-1.3b-$f.gguf"; label="Mixtral-1.28B $f" ;;
  esac
  for npl in 1 64; do
    ctx=$(( npl * (pp + tg) ))
    log="$results/batched-bench-$f-b$npl.log"
    "$bench" -m "$model" -t "$threads" -c "$ctx" -b 2048 -ub 512 -npp "$pp" -ntg "$tg" \
      -npl "$npl" --output-format jsonl > "$log" 2>&1 ||
      { echo "llama-batched-bench failed on $f, batch $npl (log: $log)" >&2; tail -5 "$log" >&2
        exit 1; }
    line="$(grep '^{"n_kv_max"' "$log" | tail -1)"
    echo "{\"model\": \"$f\", \"file\": \"$(basename "$model")\", \"cpu\": \"$cpu\"," \
      "\"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"run\": ${line}}" >> "$jsonl"
    python3 -c '
import json, sys
r = json.loads(sys.argv[1])
print("| %-22s | %3d | %11.1f | %12.2f | %11.2f | %9.1f |" % (sys.argv[2], r["pl"], r["speed_pp"],
      r["speed_tg"], r["speed"], r["t"]))' "$line" "$label"
  done
done
echo "(decode tok/s = B*TG / T_TG; total tok/s = B*(PP+TG) / T; raw: $jsonl)"
