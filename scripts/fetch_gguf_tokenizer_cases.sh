#!/usr/bin/env bash
# Makes the GGUF tokenizer cases of tests/text/test_gguf_tokenizer.cc into .deps/gguf-tokenizer/
# (tests/fixtures/make_gguf_tokenizer_cases.py says what it writes): the real SmolLM2 GGUF against
# transformers' GGUF tokenizer conversion and SmolLM2's tokenizer.json layout, GGUF files converted
# as convert_hf_to_gguf.py does from the tokenizer.json files of scripts/fetch_bpe_tokenizers.sh and
# from Mixtral's tokenizer.model files (scripts/fetch_tokenizer.sh), each with Hugging Face
# `tokenizers` / sentencepiece reference ids. Third-party data is never committed; this runs at test
# time, after the fetch scripts whose outputs it reads (it runs fetch_bpe_tokenizers.sh and
# fetch_gguf_cases.sh itself; both do nothing when up to date).
#
# Does nothing when the outputs are there and were made by this version of the generator (and of
# the two generators it borrows texts and conversations from) with these package versions and
# these inputs (.deps/gguf-tokenizer/stamp). Otherwise it makes the venv .deps/venv-hf
# (pinned transformers, tokenizers, gguf, sentencepiece, protobuf, numpy; no torch) and runs the
# generator: a few minutes on 2 cores.
#
# Usage: scripts/fetch_gguf_tokenizer_cases.sh     env: MOEBATCH_DEPS_DIR (default .deps)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
out="$deps/gguf-tokenizer"
. "$root/scripts/pinned_venv.sh"
venv="$deps/venv-hf"
packages=("${HF_VENV_PACKAGES[@]}")
fixtures="$root/tests/fixtures"
generator="$fixtures/make_gguf_tokenizer_cases.py"
names=(smollm2 llama3 qwen2 gpt2 pre-default pre-starcoder pre-dbrx pre-gpt-4o pre-tekken
       pre-stablelm2 mixtral-v1 mixtral-v3)

"$root/scripts/fetch_bpe_tokenizers.sh"
"$root/scripts/fetch_gguf_cases.sh"
inputs=("$deps/tokenizers/bpe/stamp" "$deps/gguf/stamp"
        "$deps/tokenizers/mixtral-8x7b.tokenizer.model.v1"
        "$deps/tokenizers/mixtral-8x22b.tokenizer.model.v3")
for f in "${inputs[@]}"; do
  if [ ! -f "$f" ]; then
    echo "fetch_gguf_tokenizer_cases: missing $f (scripts/fetch_tokenizer.sh fetches the Mixtral" \
         "tokenizers)" >&2
    exit 1
  fi
done

stamp="$({ cat "$generator" "$fixtures/make_bpe_tokenizer_cases.py" "$fixtures/make_chat_cases.py";
           printf '%s\n' "${packages[@]}"; cat "${inputs[@]}"; } | sha256sum | cut -d' ' -f1)"
complete=1
for n in "${names[@]}"; do
  [ -e "$out/$n/tokenizer.gguf" ] && [ -f "$out/$n/cases.jsonl" ] || complete=0
done
if [ "$complete" = 1 ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "fetch_gguf_tokenizer_cases: up to date ($out)"
  exit 0
fi
pinned_venv "$venv" "${packages[@]}"
rm -f "$out/stamp"
MOEBATCH_DEPS_DIR="$deps" "$venv/bin/python" -W ignore "$generator" --out "$out"
echo "$stamp" > "$out/stamp"
echo "fetch_gguf_tokenizer_cases: ok ($out)"
