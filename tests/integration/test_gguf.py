"""moebatchd on a GGUF file: the real SmolLM2-135M-Instruct Q4_1 (scripts/fetch_smollm2.sh, which
scripts/test.sh runs through fetch_gguf_cases.sh), the real daemon on loopback, the real Python
client.

The daemon takes the file as --model: the weights stay in their Q4_1 / Q8_0 blocks, the tokenizer
and the ChatML chat template come from the file's metadata. A job of chat lines (greedy) must give
llama.cpp's greedy tokens on the same file for the prompts of tests/fixtures/smollm2-reference/
(made by tests/fixtures/make_smollm2_reference.py with llama-cpp-python) up to a first difference
that is llama.cpp's runner-up at a near tie (tests/tools/test_gguf_fidelity.py says why); and the
answers are real text. A truncated copy of the file makes the daemon exit 1
naming the file.
"""
import importlib.util
import json
import shutil
import time
from pathlib import Path

import pytest

from conftest import ROOT, Daemon
from moebatch import Client, state_name

MODEL = ROOT / ".deps" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
REFERENCE = ROOT / "tests" / "fixtures" / "smollm2-reference" / "reference.json"

def _fidelity_module():
    path = ROOT / "tests" / "tools" / "test_gguf_fidelity.py"
    spec = importlib.util.spec_from_file_location("test_gguf_fidelity", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NEAR_TIE = _fidelity_module().NEAR_TIE  # logits: the ctest fidelity test's tolerance, and why


def reference():
    assert MODEL.exists(), f"{MODEL} missing: run scripts/fetch_smollm2.sh"
    return json.loads(REFERENCE.read_text())


def chat_line(custom_id, messages, max_tokens):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": messages, "max_tokens": max_tokens,
                                "temperature": 0, "ignore_eos": True}})


def test_gguf_chat_job_gives_llama_cpp_greedy_tokens(tmp_path):
    ref = reference()
    cases = ref["generation"]["cases"]
    daemon = Daemon(tmp_path / "data", model=MODEL).start(timeout=120)
    try:
        client = Client(daemon.addr)
        lines = [chat_line(f"p{i}", c["messages"], len(c["generated_ids"]))
                 for i, c in enumerate(cases)]
        job = client.create_job(jsonl="\n".join(lines) + "\n")
        deadline = time.time() + 300
        while state_name(client.get_job(job.id).state) not in ("completed", "failed", "cancelled"):
            assert time.time() < deadline, "the job did not finish"
            time.sleep(0.1)
        assert state_name(client.get_job(job.id).state) == "completed"
        results = {r["custom_id"]: r for r in client.results(job.id)}
        identical = 0
        for i, case in enumerate(cases):
            body = results[f"p{i}"]["response"]["body"]
            choice = body["choices"][0]
            # The chat template and tokenizer from the GGUF metadata give llama.cpp's prompt ids.
            assert body["usage"]["prompt_tokens"] == len(case["prompt_ids"]), case["messages"]
            got, want = choice["token_ids"], case["generated_ids"]
            step = next((s for s in range(len(want)) if got[s] != want[s]), None)
            assert step is None or (got[step] == case["runner_up_ids"][step] and
                                    case["top2_margin"][step] < NEAR_TIE), (i, got, want)
            identical += step is None
            assert choice["message"]["content"].strip(), "an empty answer"
        assert identical >= 3, identical
        # Real text: the answer to the first prompt is words, not noise.
        first = results["p0"]["response"]["body"]["choices"][0]["message"]["content"]
        assert sum(ch.isalpha() for ch in first) > len(first) // 2, first
    finally:
        daemon.stop()


def test_truncated_gguf_is_refused_naming_the_file(tmp_path):
    broken = tmp_path / "broken.gguf"
    with open(MODEL, "rb") as src, open(broken, "wb") as dst:
        dst.write(src.read(MODEL.stat().st_size // 2))
    daemon = Daemon(tmp_path / "data", model=broken)
    with pytest.raises(AssertionError) as failed:
        daemon.start(timeout=60)
    assert daemon.proc.wait(timeout=30) == 1
    log = daemon.log.read_text()
    assert "broken.gguf" in log and ("truncated" in log or "ends" in log), log[-2000:]
