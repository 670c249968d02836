#!/usr/bin/env bash
# The demo's throughput against llama.cpp serving the same prompts with the same threads: the
# demo (scripts/demo.sh: moebatchd with a 1 GiB KV cache and the `moebatch` client, SmolLM2-135M-
# Instruct Q4_1 by default, the AlpacaEval prompts, greedy, max_tokens 128; its KV cache 1 GiB of
# f32), then bench/llama_cpp_serve_prompts.py (llama.cpp's C API with continuous batching as
# llama-server runs it: 64 slots, 2 GiB of f16 KV cache, i.e. 4x moebatch's KV tokens) on the same
# prompt file and model. Prints both throughputs, their ratio and both peak RSS figures beside the
# model's size.
#
# Usage: bench/demo_vs_llama_cpp.sh     env: MODEL (default SmolLM2), LIMIT (default all 805),
#                                            MAX_TOKENS (default 128), THREADS (default 2)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
threads="${THREADS:-2}"
max_tokens="${MAX_TOKENS:-128}"
model="${MODEL:-$(scripts/fetch_smollm2.sh)}"
bash scripts/fetch_llama_cpp.sh > /dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
limit_args=()
[ -n "${LIMIT:-}" ] && limit_args=(--limit "$LIMIT")
python3 scripts/make_prompt_set.py --output "$work/prompts.jsonl" --max-tokens "$max_tokens" \
  "${limit_args[@]}" > /dev/null
echo "$(lscpu | sed -n 's/^Model name: *//p'), $threads threads, $(wc -l < "$work/prompts.jsonl")" \
  "prompts, max_tokens $max_tokens, $(basename "$model"); load average" \
  "$(cut -d' ' -f1-3 /proc/loadavg)"

OMP_NUM_THREADS=$threads MODEL="$model" MAX_TOKENS="$max_tokens" SHOW=0 scripts/demo.sh \
  > "$work/demo.txt" 2>&1 || { tail -20 "$work/demo.txt" >&2; exit 1; }
grep '^demo: ' "$work/demo.txt"
.deps/venv-llama/bin/python bench/llama_cpp_serve_prompts.py --model "$model" \
  --prompts "$work/prompts.jsonl" --threads "$threads" > "$work/llama.json"
python3 - "$work/demo.txt" "$work/llama.json" <<'PY'
import json, re, sys
demo = open(sys.argv[1]).read()
llama = json.load(open(sys.argv[2]))
m = re.search(r"(\d+) tokens generated in ([\d.]+) s: (\d+) generated tokens/s", demo)
rss = re.search(r"moebatchd peak RSS (\d+) MiB; model (\d+) MiB", demo)
gen, secs = int(m.group(1)), float(m.group(2))
print(f"moebatch (moebatchd + client): {gen} tokens generated in {secs:.1f} s: "
      f"{gen / secs:.1f} generated tokens/s; peak RSS {rss.group(1)} MiB "
      f"(model {rss.group(2)} MiB)")
print(f"llama.cpp (C API, continuous batching): {llama['generated_tokens']} tokens generated in "
      f"{llama['seconds']:.1f} s: {llama['generated_tokens_per_s']:.1f} generated tokens/s; peak "
      f"RSS {llama['peak_rss_bytes'] / 2**20:.0f} MiB")
print(f"ratio moebatch / llama.cpp (generated tokens/s): "
      f"{gen / secs / llama['generated_tokens_per_s']:.2f}")
print("llama.cpp raw: " + json.dumps(llama))
PY
