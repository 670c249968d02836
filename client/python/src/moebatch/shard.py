"""Splitting one OpenAI batch input file into shards, and merging the shards' results back into one
results file and one errors file with every custom_id exactly once: the file handling under a
multi-daemon driver (issue 27). No daemon and no Ray here.

split_file streams the input (never whole in memory) and writes shard files of at most
`max_requests` requests and about `max_prompt_tokens` prompt tokens each, estimated as bytes / 4
(the daemon tokenizes; the estimate only balances the shards), plus a manifest (manifest.json,
written atomically) that names every shard with its requests and the lines no daemon would take
(not a JSON object, no string custom_id, a custom_id already used), so that a rerun finds the same
shards. merge_results reads the result lines of any number of result files (a shard may have run
twice, on two daemons, after a host was lost) and keeps the first line of each custom_id.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST = "manifest.json"
BYTES_PER_TOKEN = 4  # the shard balance's estimate of prompt tokens from a line's bytes


@dataclass
class Shard:
    file: str           # the shard's file name, in the shard directory
    requests: int       # lines (requests) in it
    first_line: int     # 1-based line of the input where its first request is
    est_tokens: int     # estimated prompt tokens (bytes / BYTES_PER_TOKEN)


@dataclass
class Manifest:
    source: str                  # the input file
    source_sha256: str
    requests: int                # requests put into shards
    shards: list[Shard] = field(default_factory=list)
    # Lines left out: {"line": N, "custom_id": str | None, "message": str}.
    invalid: list[dict] = field(default_factory=list)

    def save(self, shard_dir: Path) -> None:
        tmp = shard_dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, shard_dir / MANIFEST)

    @staticmethod
    def load(shard_dir: Path) -> "Manifest":
        data = json.loads((shard_dir / MANIFEST).read_text())
        data["shards"] = [Shard(**s) for s in data["shards"]]
        return Manifest(**data)


def _custom_id(line: bytes) -> tuple[str | None, str | None]:
    """(custom_id, None) or (custom_id or None, why the line is left out)."""
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"invalid JSON: {e}"
    if not isinstance(value, dict):
        return None, "invalid JSON: a line must be a JSON object"
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, "custom_id: required, a non-empty string"
    return custom_id, None


def split_file(source: str | os.PathLike, shard_dir: str | os.PathLike, max_requests: int = 1000,
               max_prompt_tokens: int = 1_000_000) -> Manifest:
    """Splits `source` into shard_dir/shard-00000.jsonl, ... and writes shard_dir/manifest.json.
    Raises ValueError for limits below 1."""
    if max_requests < 1 or max_prompt_tokens < 1:
        raise ValueError("max_requests and max_prompt_tokens must be at least 1")
    source, shard_dir = Path(source), Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    manifest = Manifest(source=str(source), source_sha256="", requests=0)
    seen: dict[str, int] = {}
    out = None
    current: Shard | None = None

    def close() -> None:
        nonlocal out, current
        if out is not None:
            out.close()
            manifest.shards.append(current)
        out, current = None, None

    with source.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            digest.update(raw)
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            custom_id, why = _custom_id(line)
            if why is None and custom_id in seen:
                why = f"custom_id: duplicate, first used on line {seen[custom_id]}"
            if why is not None:
                manifest.invalid.append({"line": number, "custom_id": custom_id, "message": why})
                continue
            seen[custom_id] = number
            tokens = max(1, len(line) // BYTES_PER_TOKEN)
            if current is not None and (current.requests >= max_requests or
                                        current.est_tokens + tokens > max_prompt_tokens):
                close()
            if current is None:
                current = Shard(file=f"shard-{len(manifest.shards):05d}.jsonl", requests=0,
                                first_line=number, est_tokens=0)
                out = (shard_dir / current.file).open("wb")
            out.write(line + b"\n")
            current.requests += 1
            current.est_tokens += tokens
            manifest.requests += 1
    close()
    manifest.source_sha256 = digest.hexdigest()
    manifest.save(shard_dir)
    return manifest


@dataclass
class MergeReport:
    completed: int = 0     # lines in the results file
    failed: int = 0        # lines in the errors file (failed requests and left-out lines)
    duplicates: int = 0    # result lines dropped: their custom_id came before
    missing: list[str] = field(default_factory=list)  # custom_ids of the shards with no line


def _is_success(result: dict) -> bool:
    response = result.get("response")
    return (result.get("error") is None and isinstance(response, dict)
            and response.get("status_code") == 200)


def merge_results(manifest: Manifest, shard_dir: str | os.PathLike,
                  result_files: Iterable[str | os.PathLike], results_out: str | os.PathLike,
                  errors_out: str | os.PathLike) -> MergeReport:
    """Writes every custom_id of the manifest's shards once: successful lines to `results_out`,
    the others, and an error line for each line the split left out, to `errors_out`; a custom_id
    no result file has is listed in the report's `missing`."""
    shard_dir = Path(shard_dir)
    expected: set[str] = set()
    for shard in manifest.shards:
        with (shard_dir / shard.file).open("rb") as f:
            for line in f:
                expected.add(json.loads(line)["custom_id"])
    report = MergeReport()
    written: set[str] = set()
    with open(results_out, "w") as ok, open(errors_out, "w") as bad:
        for path in result_files:
            with open(path, "rb") as f:
                for raw in f:
                    if not raw.strip():
                        continue
                    result = json.loads(raw)
                    custom_id = result.get("custom_id")
                    if custom_id not in expected:
                        continue  # not of this run
                    if custom_id in written:
                        report.duplicates += 1
                        continue
                    written.add(custom_id)
                    text = json.dumps(result, ensure_ascii=False) + "\n"
                    if _is_success(result):
                        ok.write(text)
                        report.completed += 1
                    else:
                        bad.write(text)
                        report.failed += 1
        for entry in manifest.invalid:
            bad.write(json.dumps({"id": None, "custom_id": entry["custom_id"], "response": None,
                                  "error": {"code": "invalid_request",
                                            "message": f"line {entry['line']}: "
                                                       f"{entry['message']}"}}) + "\n")
            report.failed += 1
    report.missing = sorted(expected - written)
    return report
