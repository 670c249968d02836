"""moebatch.shard: splitting a batch file into shards and merging results exactly once, and the
atomic writes every file of a shard run goes through."""
import json

import pytest

from moebatch.shard import (BYTES_PER_TOKEN, Manifest, atomic_file, atomic_write, file_sha256,
                            merge_results, merge_shards, shard_custom_ids, split_file)


def line(custom_id, prompt="Hello", **extra):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": prompt, "max_tokens": 4}, **extra})


def write(path, lines):
    path.write_text("".join(l + "\n" for l in lines))
    return path


def read_lines(path):
    return [json.loads(l) for l in path.read_text().splitlines()]


def result(custom_id, ok=True):
    if ok:
        return {"id": f"batch_req_{custom_id}", "custom_id": custom_id,
                "response": {"status_code": 200, "body": {}}, "error": None}
    return {"id": f"batch_req_{custom_id}", "custom_id": custom_id,
            "response": {"status_code": 400, "body": {"error": {"message": "bad"}}},
            "error": None}


def test_split_by_request_count_keeps_order_and_leaves_out_bad_lines(tmp_path):
    lines = [line(f"r{i}") for i in range(10)]
    lines[3:3] = ["not json", "", json.dumps([1, 2]), line("r1"), json.dumps({"custom_id": 7})]
    source = write(tmp_path / "in.jsonl", lines)
    manifest = split_file(source, tmp_path / "shards", max_requests=4)
    assert manifest.requests == 10
    assert [s.requests for s in manifest.shards] == [4, 4, 2]
    ids = [r["custom_id"] for s in manifest.shards for r in read_lines(tmp_path / "shards" / s.file)]
    assert ids == [f"r{i}" for i in range(10)]
    assert manifest.shards[0].first_line == 1 and manifest.shards[1].first_line == 10
    assert [e["line"] for e in manifest.invalid] == [4, 6, 7, 8]
    assert manifest.invalid[2]["message"] == "custom_id: duplicate, first used on line 2"
    # The manifest reads back the same (a rerun finds the shards).
    assert Manifest.load(tmp_path / "shards") == manifest


def test_split_by_estimated_prompt_tokens(tmp_path):
    long = "word " * 400  # ~2 KB: ~500 estimated tokens per line
    source = write(tmp_path / "in.jsonl", [line(f"r{i}", long) for i in range(6)])
    per_line = len(line("r0", long)) // BYTES_PER_TOKEN
    manifest = split_file(source, tmp_path / "shards", max_requests=100,
                          max_prompt_tokens=2 * per_line + 10)
    assert [s.requests for s in manifest.shards] == [2, 2, 2]
    with pytest.raises(ValueError):
        split_file(source, tmp_path / "x", max_requests=0)


def test_merge_writes_every_custom_id_once_and_reports_the_missing(tmp_path):
    source = write(tmp_path / "in.jsonl", [line(f"r{i}") for i in range(6)] + ["{bad"])
    shards = tmp_path / "shards"
    manifest = split_file(source, shards, max_requests=3)
    # Shard 0 ran twice (its daemon was lost, then it ran elsewhere); r5 never ran.
    run_a = write(tmp_path / "a.jsonl", [json.dumps(result(f"r{i}")) for i in range(3)])
    run_b = write(tmp_path / "b.jsonl", [json.dumps(result(f"r{i}")) for i in (2, 1, 0)] +
                  [json.dumps(result("r3")), json.dumps(result("r4", ok=False)),
                   json.dumps(result("stranger"))])
    report = merge_results(manifest, shards, [run_a, run_b], tmp_path / "out.jsonl",
                           tmp_path / "errors.jsonl")
    assert report.duplicates == 3 and report.missing == ["r5"]
    assert report.completed == 4 and report.failed == 2
    assert [r["custom_id"] for r in read_lines(tmp_path / "out.jsonl")] == ["r0", "r1", "r2", "r3"]
    errors = read_lines(tmp_path / "errors.jsonl")
    assert [e["custom_id"] for e in errors] == ["r4", None]
    assert errors[1]["error"]["message"].startswith("line 7: invalid JSON")


def test_manifest_names_each_shards_sha256_and_the_split(tmp_path):
    source = write(tmp_path / "in.jsonl", [line(f"r{i}") for i in range(5)])
    manifest = split_file(source, tmp_path / "shards", max_requests=2, max_prompt_tokens=999)
    assert (manifest.max_requests, manifest.max_prompt_tokens) == (2, 999)
    for shard in manifest.shards:
        assert shard.sha256 == file_sha256(tmp_path / "shards" / shard.file)
    assert manifest.shards[0].name == "shard-00000"
    assert manifest.source_sha256 == file_sha256(source)
    assert shard_custom_ids(tmp_path / "shards", manifest.shards[2]) == ["r4"]


def test_merge_shards_one_shard_at_a_time(tmp_path):
    source = write(tmp_path / "in.jsonl", [line(f"r{i}") for i in range(6)] + ["{bad"])
    shards = tmp_path / "shards"
    manifest = split_file(source, shards, max_requests=2)
    # Shard 0 ran twice; shard 1's file also holds a line of shard 2 (ignored there); shard 2
    # has no file: its custom_ids are missing.
    files = {
        "shard-00000": [write(tmp_path / "0a.jsonl", [json.dumps(result("r1")),
                                                       json.dumps(result("r0"))]),
                        write(tmp_path / "0b.jsonl", [json.dumps(result("r0", ok=False))])],
        "shard-00001": [write(tmp_path / "1.jsonl", [json.dumps(result("r2")),
                                                      json.dumps(result("r4")),
                                                      json.dumps(result("r3", ok=False))])],
    }
    report = merge_shards(manifest, shards, lambda s: files.get(s.name, []),
                          tmp_path / "out.jsonl", tmp_path / "errors.jsonl")
    assert [r["custom_id"] for r in read_lines(tmp_path / "out.jsonl")] == ["r1", "r0", "r2"]
    assert [e["custom_id"] for e in read_lines(tmp_path / "errors.jsonl")] == ["r3", None]
    assert report.duplicates == 1 and report.missing == ["r4", "r5"]
    assert (report.completed, report.failed) == (3, 2)


def test_atomic_file_writes_whole_or_not_at_all(tmp_path):
    target = tmp_path / "out.jsonl"
    atomic_write(target, b"old\n")
    with pytest.raises(RuntimeError):
        with atomic_file(target, "w") as f:
            f.write("half")
            raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
    with atomic_file(target, "w") as f:
        f.write("new\n")
    assert target.read_text() == "new\n"
