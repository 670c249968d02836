"""Splitting one OpenAI batch input file into shards, and merging the shards' results back into one
results file and one errors file with every custom_id exactly once: the file handling under the
multi-daemon driver (moebatch.ray_driver). No daemon and no Ray here.

split_file streams the input (never whole in memory) and writes shard files of at most
`max_requests` requests and about `max_prompt_tokens` prompt tokens each, estimated as bytes / 4
(the daemon tokenizes; the estimate only balances the shards), plus a manifest (manifest.json,
written atomically once every shard file is on disk) that names every shard with its requests and
sha256 and the lines no daemon would take (not a JSON object, no string custom_id, a custom_id
already used), so that a rerun finds the same shards. merge_results reads the result lines of any
number of result files (a shard may have run twice, on two daemons, after a host was lost) and
keeps the first line of each custom_id; merge_shards does the same one shard at a time, so its
memory is that of the largest shard, not of the whole input.

Every file here is written atomically: to a temporary file beside the target, flushed to disk
(fsync), renamed over the target, and the directory synced; a crash leaves the old file or the new
one, never a part.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

MANIFEST = "manifest.json"
BYTES_PER_TOKEN = 4  # the shard balance's estimate of prompt tokens from a line's bytes


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """Opens a temporary file beside `path` for writing ("wb" or "w": UTF-8, "\\n" line ends);
    when the block ends without an exception, flushes it to disk and renames it over `path` (then
    syncs the directory), else removes it. Raises OSError from the file system."""
    if mode not in ("wb", "w"):
        raise ValueError(f"mode: must be 'wb' or 'w', got {mode!r}")
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with (os.fdopen(fd, "wb") if mode == "wb"
              else os.fdopen(fd, "w", encoding="utf-8", newline="\n")) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_dir(target.parent)


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to `path` atomically (see atomic_file)."""
    with atomic_file(path) as f:
        f.write(data)


@dataclass
class Shard:
    file: str           # the shard's file name, in the shard directory
    requests: int       # lines (requests) in it
    first_line: int     # 1-based line of the input where its first request is
    est_tokens: int     # estimated prompt tokens (bytes / BYTES_PER_TOKEN)
    sha256: str = ""    # of the shard file's bytes

    @property
    def name(self) -> str:
        """The file name without ".jsonl": "shard-00003"."""
        return self.file.removesuffix(".jsonl")


@dataclass
class Manifest:
    source: str                  # the input file
    source_sha256: str
    requests: int                # requests put into shards
    shards: list[Shard] = field(default_factory=list)
    # Lines left out: {"line": N, "custom_id": str | None, "message": str}.
    invalid: list[dict] = field(default_factory=list)
    max_requests: int = 0        # the split's limits (0: not recorded)
    max_prompt_tokens: int = 0

    def save(self, shard_dir: Path) -> None:
        """Writes shard_dir/manifest.json atomically."""
        atomic_write(Path(shard_dir) / MANIFEST, json.dumps(asdict(self), indent=1).encode())

    @staticmethod
    def load(shard_dir: Path) -> "Manifest":
        """Reads shard_dir/manifest.json. Raises OSError when it cannot be read, ValueError or
        TypeError when it is not a manifest."""
        data = json.loads((Path(shard_dir) / MANIFEST).read_text())
        data["shards"] = [Shard(**s) for s in data["shards"]]
        return Manifest(**data)


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The sha256 of a file's bytes, hex; read in `chunk`-byte pieces. Raises OSError."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


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


def _sync_and_close(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def split_file(source: str | os.PathLike, shard_dir: str | os.PathLike, max_requests: int = 1000,
               max_prompt_tokens: int = 1_000_000) -> Manifest:
    """Splits `source` into shard_dir/shard-00000.jsonl, ... and writes shard_dir/manifest.json
    last, once every shard file is on disk (a crash before leaves no manifest: split again).
    Raises ValueError for limits below 1, OSError from the file system. Memory: the custom_ids
    seen so far (for duplicates), one shard's state."""
    if max_requests < 1 or max_prompt_tokens < 1:
        raise ValueError("max_requests and max_prompt_tokens must be at least 1")
    source, shard_dir = Path(source), Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    manifest = Manifest(source=str(source), source_sha256="", requests=0,
                        max_requests=max_requests, max_prompt_tokens=max_prompt_tokens)
    seen: dict[str, int] = {}
    out = None
    current: Shard | None = None
    shard_digest = hashlib.sha256()

    def close() -> None:
        nonlocal out, current
        if out is not None:
            _sync_and_close(out)
            current.sha256 = shard_digest.hexdigest()
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
                shard_digest = hashlib.sha256()
            out.write(line + b"\n")
            shard_digest.update(line + b"\n")
            current.requests += 1
            current.est_tokens += tokens
            manifest.requests += 1
    close()
    _sync_dir(shard_dir)
    manifest.source_sha256 = digest.hexdigest()
    manifest.save(shard_dir)
    return manifest


def shard_custom_ids(shard_dir: str | os.PathLike, shard: Shard) -> list[str]:
    """The custom_ids of a shard's requests, in order (the shard file's lines, which split_file
    checked). Raises OSError."""
    with (Path(shard_dir) / shard.file).open("rb") as f:
        return [json.loads(line)["custom_id"] for line in f if line.strip()]


def error_line(custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    """An OpenAI batch error line for a request that has no result from a daemon."""
    return {"id": None, "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


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


class _Merger:
    """Writes result lines to the results or the errors file, each custom_id of `expected` once,
    each line as the daemon wrote it."""

    def __init__(self, ok: IO[bytes], bad: IO[bytes], report: MergeReport):
        self.ok, self.bad, self.report = ok, bad, report

    def merge(self, expected: set[str], result_files: Iterable[str | os.PathLike]) -> None:
        written: set[str] = set()
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
                        self.report.duplicates += 1
                        continue
                    written.add(custom_id)
                    text = raw.rstrip(b"\r\n") + b"\n"
                    if _is_success(result):
                        self.ok.write(text)
                        self.report.completed += 1
                    else:
                        self.bad.write(text)
                        self.report.failed += 1
        self.report.missing.extend(sorted(expected - written))

    def left_out(self, manifest: Manifest) -> None:
        for entry in manifest.invalid:
            self.bad.write(json.dumps(error_line(
                entry["custom_id"], "invalid_request",
                f"line {entry['line']}: {entry['message']}")).encode() + b"\n")
            self.report.failed += 1


def merge_results(manifest: Manifest, shard_dir: str | os.PathLike,
                  result_files: Iterable[str | os.PathLike], results_out: str | os.PathLike,
                  errors_out: str | os.PathLike) -> MergeReport:
    """Writes every custom_id of the manifest's shards once, each line as it is in its result
    file: successful lines to `results_out`, the others, and an error line for each line the split
    left out, to `errors_out` (both written atomically); a custom_id no result file has is listed
    in the report's `missing`. Memory: every custom_id of the manifest (see merge_shards for one
    shard at a time). Raises OSError, and ValueError for a result line that is not JSON."""
    shard_dir = Path(shard_dir)
    expected: set[str] = set()
    for shard in manifest.shards:
        expected.update(shard_custom_ids(shard_dir, shard))
    report = MergeReport()
    with atomic_file(results_out) as ok, atomic_file(errors_out) as bad:
        merger = _Merger(ok, bad, report)
        merger.merge(expected, result_files)
        merger.left_out(manifest)
    return report


def merge_shards(manifest: Manifest, shard_dir: str | os.PathLike,
                 result_files: Callable[[Shard], Iterable[str | os.PathLike]],
                 results_out: str | os.PathLike, errors_out: str | os.PathLike) -> MergeReport:
    """As merge_results, shard by shard in the manifest's order: result_files(shard) names the
    files holding that shard's results (a custom_id of another shard in them is ignored). The
    output follows the input's order where each file does; memory is one shard's custom_ids."""
    shard_dir = Path(shard_dir)
    report = MergeReport()
    with atomic_file(results_out) as ok, atomic_file(errors_out) as bad:
        merger = _Merger(ok, bad, report)
        for shard in manifest.shards:
            merger.merge(set(shard_custom_ids(shard_dir, shard)), result_files(shard))
        merger.left_out(manifest)
    return report
