#!/usr/bin/env bash
# Runs a small OpenAI-batch JSONL job through moebatch-run on the tiny golden Mixtral (random
# weights, real Mixtral tokenizer): installs what it needs, builds, runs, prints the results.
# (The daemon's demo is scripts/demo.sh.)
#
# Usage: scripts/run_example.sh [MODEL_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
model="${1:-tests/fixtures/tiny-mixtral}"
build="${BUILD_DIR:-build}"

scripts/build.sh moebatch-run

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/in.jsonl" <<'JSONL'
{"custom_id": "chat-1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Write a haiku about memory bandwidth."}], "max_tokens": 24, "temperature": 0}}
{"custom_id": "chat-2", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is a mixture of experts?"}], "max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "seed": 7}}
{"custom_id": "completion-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0.7, "top_k": 40, "seed": 1, "stop": ["\n\n"]}}
{"custom_id": "bad-1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [], "max_tokens": 8}}
JSONL
"$build/engine/moebatch-run" --model "$model" --input "$work/in.jsonl" --output "$work/out.jsonl"
echo "--- output ($work/out.jsonl) ---"
python3 - "$work/out.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    r = o["response"]
    if r and r["status_code"] == 200:
        c = r["body"]["choices"][0]
        text = c.get("text", c.get("message", {}).get("content"))
        print(f'{o["custom_id"]}: {c["finish_reason"]}, {len(c["token_ids"])} tokens: {text!r}')
    else:
        err = (r or {}).get("body", {}).get("error") or o["error"]
        print(f'{o["custom_id"]}: error: {err["message"]}')
PY
