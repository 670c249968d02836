#!/usr/bin/env bash
# What moebatch holds in memory for an MXFP4 gpt-oss checkpoint: peak RSS of moebatch-run on a
# gpt-oss-20b-shaped checkpoint with random weights (bench/make_gpt_oss_mxfp4.py: LAYERS of its 24
# layers, experts as the official *_blocks / *_scales), against the file size plus the KV cache.
# Experts stay 4.25 bits per weight (ggml's MXFP4 blocks, repacked at load) and the file's expert
# pages are dropped once repacked, so the peak should be about the file plus the KV cache; bf16
# experts would take 3.8x the expert bytes.
#
# Usage: bench/gpt_oss_mxfp4_memory.sh [LAYERS]      (default 4: a 2.1 GiB file)
#        env: MOEBATCH_DEPS_DIR (default .deps), MOEBATCH_BUILD_DIR (default build),
#             PYTHON_FIXTURES (default .venv-fixtures/bin/python: torch and safetensors)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
build="${MOEBATCH_BUILD_DIR:-$root/build}"
py="${PYTHON_FIXTURES:-$root/.venv-fixtures/bin/python}"
layers="${1:-4}"
run="$build/engine/moebatch-run"
[ -x "$run" ] || { echo "no $run: build moebatch first" >&2; exit 1; }
model="$deps/bench-models/gpt-oss-20b-mxfp4-${layers}l"
if [ ! -f "$model/model.safetensors" ]; then
  "$py" "$root/bench/make_gpt_oss_mxfp4.py" --out "$model" --layers "$layers"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$work/in.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(8):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "m", "prompt": f"Request {i}: once upon a time",
                                     "max_tokens": 16, "temperature": 0}}) + "\n")
PY
kv_gb=0.25
/usr/bin/time -f "%M" -o "$work/rss" "$run" --model "$model" --input "$work/in.jsonl" \
  --output "$work/out.jsonl" --kv_cache_gb "$kv_gb" --progress=false 2> "$work/log" ||
  { tail -5 "$work/log" >&2; exit 1; }
[ "$(wc -l < "$work/out.jsonl")" = 8 ] || { echo "expected 8 results" >&2; exit 1; }
file_bytes="$(stat -c %s "$model/model.safetensors")"
python3 - "$(cat "$work/rss")" "$file_bytes" "$kv_gb" "$layers" <<'PY'
import sys
rss_kib, file_bytes, kv_gb, layers = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rss, f, kv = rss_kib * 1024 / 2**30, file_bytes / 2**30, kv_gb
print(f"gpt-oss-20b shapes, {layers} layers, MXFP4 experts: file {f:.2f} GiB, KV cache {kv:.2f} GiB, "
      f"peak RSS {rss:.2f} GiB = {rss / (f + kv):.2f}x (file + KV cache)")
PY
