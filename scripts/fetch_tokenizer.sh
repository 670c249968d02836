#!/usr/bin/env bash
# Fetches the real Mixtral-8x7B sentencepiece tokenizer (32,000 pieces) from the PyPI package
# mistral-common (mistral_common/data/tokenizer.model.v1) and places it as tokenizer.model in each
# fixture model directory and in each benchmark model directory (bench/models/*: Mixtral-shaped
# configs whose weights are synthetic; the engine still detokenizes with the real tokenizer).
# Third-party data is never committed; this runs at install time.
#
# Usage: scripts/fetch_tokenizer.sh [DEST_DIR ...]
#        (default: every model dir under tests/fixtures and bench/models)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version=1.13.1
sha256=dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055
cache="${MOEBATCH_DEPS_DIR:-$root/.deps}/tokenizers"
model="$cache/mixtral-8x7b.tokenizer.model.v1"

if [ ! -f "$model" ] || ! echo "$sha256  $model" | sha256sum -c --status; then
  mkdir -p "$cache"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps "mistral-common==$version" -d "$tmp"
  unzip -q -o "$tmp"/mistral_common-"$version"-*.whl mistral_common/data/tokenizer.model.v1 -d "$tmp"
  cp "$tmp/mistral_common/data/tokenizer.model.v1" "$model"
  echo "$sha256  $model" | sha256sum -c --status || { echo "fetch_tokenizer: checksum mismatch" >&2; exit 1; }
fi

if [ $# -eq 0 ]; then
  set -- $(find "$root/tests/fixtures" "$root/bench/models" -name config.json -printf '%h\n' | sort)
fi
for dir in "$@"; do
  cp "$model" "$dir/tokenizer.model"
done
echo "fetch_tokenizer: ok ($model)"
