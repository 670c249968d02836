#!/usr/bin/env python3
"""End-to-end test of moebatch-run on the tiny golden Mixtral (run by ctest; plain python3).

Feeds an OpenAI-batch JSONL file with good chat and completion lines, bad lines and blank lines,
and checks that every non-blank input line has one output line in input order, that bad lines
became error lines while the rest ran (a warning listing each bad line by its line number in the
file), that greedy completions given as token ids reproduce the golden transformers tokens, and
that the progress bar and the summary went to stderr. Then checks that an unreadable --input or an
unwritable --output fails (exit 1, naming the flag) before the model loads: with a --model that
does not exist, the error names the file flag, not the model.

Usage: test_runner.py MOEBATCH_RUN FIXTURES_DIR
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def check_files_before_model(runner: str) -> None:
    """--input / --output problems are reported before the model is loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        good_in = Path(tmp, "in.jsonl")
        good_in.write_text("")
        no_model = str(Path(tmp, "no-such-model"))
        cases = [
            (["--input", str(Path(tmp, "missing.jsonl")), "--output", str(Path(tmp, "o.jsonl"))],
             "--input"),
            (["--input", tmp, "--output", str(Path(tmp, "o.jsonl"))], "--input"),  # a directory
            (["--input", str(good_in), "--output", str(Path(tmp, "no-dir", "o.jsonl"))],
             "--output"),
            (["--input", str(good_in), "--output", tmp], "--output"),  # a directory
        ]
        for args, flag in cases:
            proc = subprocess.run([runner, "--model", no_model, *args], capture_output=True,
                                  text=True, timeout=120)
            assert proc.returncode == 1, (args, proc.returncode, proc.stderr)
            first = proc.stderr.strip().splitlines()[0]
            assert first.startswith(f"moebatch-run: {flag} "), (args, proc.stderr)
            assert "model" not in first, (args, proc.stderr)
        assert not Path(tmp, "o.jsonl").exists()  # nothing created on failure
        # Missing flags are still usage errors (2).
        proc = subprocess.run([runner, "--model", no_model, "--input", str(good_in)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr


def main() -> int:
    runner, fixtures = sys.argv[1], Path(sys.argv[2])
    check_files_before_model(runner)
    model = fixtures / "tiny-mixtral"
    golden = [json.loads(line) for line in open(model / "golden.jsonl")]
    lines = []
    for i, g in enumerate(golden[:3]):
        lines.append({"custom_id": f"golden-{i}", "method": "POST", "url": "/v1/completions",
                      "body": {"prompt": g["prompt_token_ids"], "max_tokens": len(g["greedy_token_ids"]),
                               "temperature": 0, "ignore_eos": True}})
    lines.append({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"messages": [{"role": "user", "content": "Hi there"}],
                           "max_tokens": 8, "temperature": 0.7, "seed": 5}})
    raw = [json.dumps(l) for l in lines]
    raw.insert(1, "{this is not json")
    raw.insert(3, json.dumps({"custom_id": "bad-temp", "method": "POST", "url": "/v1/completions",
                              "body": {"prompt": "x", "temperature": -3}}))
    raw.append(json.dumps({"custom_id": "bad-roles", "method": "POST",
                           "url": "/v1/chat/completions",
                           "body": {"messages": [{"role": "assistant", "content": "hi"}]}}))
    # Blank and whitespace-only lines are skipped; the file's line numbers count them.
    text = "\n".join(raw[:3]) + "\n\n   \n" + "\n".join(raw[3:]) + "\n\n"
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp, "in.jsonl"), Path(tmp, "out.jsonl")
        inp.write_text(text)
        proc = subprocess.run([runner, "--model", str(model), "--input", str(inp), "--output", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "requests" in proc.stderr and "tok/s" in proc.stderr, "no progress on stderr"
        assert "done: 7 lines, 4 requests ran, 3 failed lines" in proc.stderr, proc.stderr
        # The warning lists every bad line by its line number in the file (blank lines counted).
        assert ('3 of 7 lines are invalid: line 2: invalid JSON: ' in proc.stderr and
                '; line 6 (custom_id "bad-temp"): body.temperature: ' in proc.stderr and
                '; line 9 (custom_id "bad-roles"): body.messages[0]' in proc.stderr), proc.stderr
        outputs = [json.loads(l) for l in out.read_text().splitlines()]

    assert len(outputs) == len(raw), (len(outputs), len(raw))
    ids = [o["custom_id"] for o in outputs]
    assert ids == ["golden-0", None, "golden-1", "bad-temp", "golden-2", "chat", "bad-roles"], ids
    for i in range(3):
        o = outputs[[0, 2, 4][i]]
        assert o["error"] is None and o["response"]["status_code"] == 200
        choice = o["response"]["body"]["choices"][0]
        assert choice["token_ids"] == golden[i]["greedy_token_ids"], f"golden-{i} tokens differ"
        assert choice["text"] == golden[i]["greedy_text"], f"golden-{i} text differs"
        assert choice["finish_reason"] == "length"
        usage = o["response"]["body"]["usage"]
        assert usage["prompt_tokens"] == len(golden[i]["prompt_token_ids"])
        assert usage["completion_tokens"] == len(golden[i]["greedy_token_ids"])
    assert outputs[1]["response"] is None and outputs[1]["error"]["code"] == "invalid_json"
    bad = outputs[3]["response"]
    assert bad["status_code"] == 400 and bad["body"]["error"]["message"].startswith("body.temperature")
    roles = outputs[6]["response"]
    assert roles["status_code"] == 400 and roles["body"]["error"]["message"].startswith("body.messages[0]")
    chat = outputs[5]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= len(chat["choices"][0]["token_ids"]) <= 8
    print("runner test: 7 lines, 4 ran, 3 error lines: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
