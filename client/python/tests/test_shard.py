"""moebatch.shard: splitting a batch file into shards and merging results exactly once."""
import json

import pytest

from moebatch.shard import BYTES_PER_TOKEN, Manifest, merge_results, split_file


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
