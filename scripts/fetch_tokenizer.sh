#!/usr/bin/env bash
# Fetches the real Mistral sentencepiece tokenizers from the PyPI package mistral-common (its
# mistral_common/data/ folder), checksum-pinned, into the cache .deps/tokenizers/:
#   mixtral-8x7b.tokenizer.model.v1   Mixtral-8x7B (32,000 pieces; "[INST]" is text)
#   mixtral-8x22b.tokenizer.model.v3  Mixtral-8x22B-Instruct-v0.1 (32,768 pieces; [INST]/[/INST]
#                                     control pieces; mistral-common's v3 for open-mixtral-8x22b)
#   mistral.tokenizer.model.v7        mistral-common's v7 ([SYSTEM_PROMPT] control pieces)
# and places the first as tokenizer.model in each fixture model directory and in each benchmark
# model directory (bench/models/*: Mixtral-shaped configs whose weights are synthetic; the engine
# still detokenizes with the real tokenizer), the v3 and v7 ones in tests/fixtures/mistral-v3/ and
# tests/fixtures/mistral-v7/ (the tokenizer tests' chat-layout cases).
# Third-party data is never committed; this runs at install time.
#
# Usage: scripts/fetch_tokenizer.sh [DEST_DIR ...]
#        (default: every model dir under tests/fixtures and bench/models; DEST_DIRs get the v1 one)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version=1.13.1
cache="${MOEBATCH_DEPS_DIR:-$root/.deps}/tokenizers"
# cache name, file in the wheel's mistral_common/data/, sha256
files=(
  "mixtral-8x7b.tokenizer.model.v1 tokenizer.model.v1
   dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055"
  "mixtral-8x22b.tokenizer.model.v3 mistral_instruct_tokenizer_240323.model.v3
   9addc8bdce5988448ae81b729336f43a81262160ae8da760674badab9d4c7d33"
  "mistral.tokenizer.model.v7 mistral_instruct_tokenizer_241114.model.v7
   1b968b8dc352f42192367337c78ccc61e1eaddc6d641a579372d4f20694beb7a"
)

wheel_dir=""
trap '[ -z "$wheel_dir" ] || rm -rf "$wheel_dir"' EXIT
for entry in "${files[@]}"; do
  read -r -d "" name member sha256 <<< "$entry" || true  # (the entry spans two lines)
  if [ -f "$cache/$name" ] && echo "$sha256  $cache/$name" | sha256sum -c --status; then continue; fi
  mkdir -p "$cache"
  if [ -z "$wheel_dir" ]; then
    wheel_dir="$(mktemp -d)"
    python3 -m pip download -q --no-deps "mistral-common==$version" -d "$wheel_dir"
  fi
  unzip -q -o "$wheel_dir"/mistral_common-"$version"-*.whl "mistral_common/data/$member" \
    -d "$wheel_dir"
  cp "$wheel_dir/mistral_common/data/$member" "$cache/$name"
  echo "$sha256  $cache/$name" | sha256sum -c --status ||
    { echo "fetch_tokenizer: checksum mismatch for $name" >&2; exit 1; }
done

model="$cache/mixtral-8x7b.tokenizer.model.v1"
if [ $# -eq 0 ]; then
  set -- $(find "$root/tests/fixtures" "$root/bench/models" -name config.json -printf '%h\n' | sort)
  cp "$cache/mixtral-8x22b.tokenizer.model.v3" "$root/tests/fixtures/mistral-v3/tokenizer.model"
  cp "$cache/mistral.tokenizer.model.v7" "$root/tests/fixtures/mistral-v7/tokenizer.model"
fi
for dir in "$@"; do
  cp "$model" "$dir/tokenizer.model"
done
echo "fetch_tokenizer: ok ($cache)"
