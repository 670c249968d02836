"""moebatchd on the model families beyond Mixtral: the real daemon on loopback, the real Python client.

For each tiny golden fixture of tests/fixtures/make_tiny_families.py (llama, mistral, qwen2, qwen3,
qwen2_moe, qwen3_moe, olmoe, dbrx), a daemon started with --model on it runs one job of the 8 golden
prompts as token-id completion lines (greedy, ignore_eos, 32 tokens) and a chat line; the results
must be transformers' greedy tokens and text. Then bad model directories: a daemon on an unknown
model_type or a corrupt tokenizer.json exits 1 saying why last, naming the file and the field; a
model whose tokenizer.json comes with a chat template moebatch does not recognise starts, refuses
a job holding a chat line (naming the line, --chat_template and the reason), runs prompts, and
keeps serving; with --chat_template NAME the same job runs.

The last test takes a real tokenizer.json from .deps/tokenizers/bpe/llama2 (a 3,000-token BPE
tokenizer whose ids fit the fixtures' 32,000-row embedding), made by scripts/fetch_bpe_tokenizers.sh,
which scripts/test.sh runs before these tests.
"""
import json
import shutil
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from conftest import BUILD, ROOT, Daemon, free_port
from moebatch import Client, ClientError, state_name

FIXTURES = ROOT / "tests" / "fixtures"
FAMILIES = ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-qwen2-moe",
            "tiny-qwen3-moe", "tiny-olmoe", "tiny-dbrx", "tiny-deepseek-v2", "tiny-deepseek-v3",
            "tiny-gpt-oss"]
SUPPORTED = ("dbrx, deepseek_v2, deepseek_v3, gpt_oss, llama, mistral, mixtral, olmoe, qwen2, "
             "qwen2_moe, qwen3, qwen3_moe")
LLAMA2_BPE = ROOT / ".deps" / "tokenizers" / "bpe" / "llama2"
# A Jinja chat template no layout of moebatch's matches.
UNKNOWN_TEMPLATE = ("{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] | upper }}"
                    "{% endfor %}{% if add_generation_prompt %}<<assistant>>{% endif %}")


class ModelDaemon(Daemon):
    """conftest's Daemon, on another model directory than the tiny Mixtral."""

    def __init__(self, data_dir: Path, model: Path, extra_args=()):
        super().__init__(data_dir, extra_args, model=model)


def completion_line(custom_id, prompt, max_tokens=32):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                "ignore_eos": True}})


def chat_line(custom_id, text, max_tokens=8):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": text}],
                                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}})


def run_job(client, lines, timeout=120):
    """Submits `lines`, waits, returns (job, results by custom_id, in input order)."""
    job = client.create_job(jsonl="\n".join(lines) + "\n")
    deadline = time.time() + timeout
    while state_name(client.get_job(job.id).state) not in ("completed", "failed", "cancelled"):
        assert time.time() < deadline, f"job {job.id} did not finish"
        time.sleep(0.05)
    results = list(client.results(job.id))
    assert [r["custom_id"] for r in results] == [json.loads(l)["custom_id"] for l in lines]
    return client.get_job(job.id), results


def copy_fixture(name: str, dest: Path) -> Path:
    """A copy of a fixture directory: weights symlinked, the small files copied, no golden."""
    dest.mkdir(parents=True)
    for f in (FIXTURES / name).iterdir():
        if f.name.endswith(".safetensors"):
            (dest / f.name).symlink_to(f)
        elif f.name != "golden.jsonl":
            shutil.copy(f, dest / f.name)
    return dest


@pytest.mark.parametrize("family", FAMILIES)
def test_golden_tokens_through_the_daemon(tmp_path, family):
    model = FIXTURES / family
    golden = [json.loads(l) for l in open(model / "golden.jsonl")]
    arch = json.loads((model / "config.json").read_text())["architectures"][0]
    d = ModelDaemon(tmp_path / "data", model).start()
    try:
        client = Client(d.addr, timeout=60)
        lines = [completion_line(f"golden-{i}", g["prompt_token_ids"], len(g["greedy_token_ids"]))
                 for i, g in enumerate(golden)] + [chat_line("chat", "Hello")]
        job, results = run_job(client, lines)
        assert state_name(job.state) == "completed"
        assert job.request_counts.completed == len(lines) and job.request_counts.failed == 0
        for i, g in enumerate(golden):
            assert results[i]["error"] is None and results[i]["response"]["status_code"] == 200
            choice = results[i]["response"]["body"]["choices"][0]
            assert choice["token_ids"] == g["greedy_token_ids"], (
                f"{family} golden-{i}\n got  {choice['token_ids']}\n want {g['greedy_token_ids']}")
            assert choice["text"] == g["greedy_text"], (family, i, choice["text"])
            assert choice["finish_reason"] == "length"
            assert results[i]["response"]["body"]["usage"]["prompt_tokens"] == len(
                g["prompt_token_ids"])
        # The fixtures' tokenizer is Mixtral's sentencepiece: the Mistral layout, "[INST] Hello
        # [/INST]" after BOS (9 tokens).
        chat = results[-1]["response"]
        assert chat["status_code"] == 200, chat
        assert chat["body"]["object"] == "chat.completion"
        assert chat["body"]["choices"][0]["message"]["role"] == "assistant"
        assert len(chat["body"]["choices"][0]["token_ids"]) == 8
        assert chat["body"]["usage"]["prompt_tokens"] == 9
    finally:
        d.stop()
    log = d.log.read_text()
    assert f"loaded {arch} from {model}" in log, log[-2000:]
    assert "chat layout mistral-v1" in log, log[-2000:]


def start_and_fail(tmp_path: Path, model: Path):
    """Runs moebatchd on `model`, expecting it to stop; returns (exit code, stderr lines)."""
    out = subprocess.run(
        [str(BUILD / "server" / "moebatchd"), "--model", str(model), "--listen",
         f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data"), "--kv-cache-gb",
         "0.25"], capture_output=True, text=True, timeout=120)
    return out.returncode, [l for l in out.stderr.splitlines() if l.strip()]


def test_an_unknown_model_type_stops_the_daemon_naming_file_and_field(tmp_path):
    model = copy_fixture("tiny-qwen3-moe", tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "gpt_neox"
    (model / "config.json").write_text(json.dumps(config))
    code, lines = start_and_fail(tmp_path, model)
    assert code == 1, lines[-5:]
    assert lines[-1] == (f'moebatchd: cannot load model: INVALID_ARGUMENT: {model}/config.json: '
                         f'key "model_type" is "gpt_neox", which moebatch does not run; it runs '
                         f'{SUPPORTED}'), lines[-5:]
    assert not any("serving model" in l for l in lines)


@pytest.mark.parametrize("keep_tokenizer_model", [False, True])
def test_a_corrupt_tokenizer_json_stops_the_daemon_naming_the_file(tmp_path,
                                                                   keep_tokenizer_model):
    """Truncated JSON, in place of tokenizer.model or beside it (tokenizer.json is preferred)."""
    model = copy_fixture("tiny-olmoe", tmp_path / "model")
    if not keep_tokenizer_model:
        (model / "tokenizer.model").unlink()
    (model / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": '
                                          '{"<unk>": 0, "<s>": 1, "</s>"')
    code, lines = start_and_fail(tmp_path, model)
    assert code == 1, lines[-5:]
    assert lines[-1].startswith(f"moebatchd: cannot load model: INVALID_ARGUMENT: "
                                f"{model}/tokenizer.json: not valid JSON: "), lines[-5:]
    assert "parse error at line 1" in lines[-1] and "unexpected end of input" in lines[-1]
    assert not any("serving model" in l for l in lines)


def test_no_tokenizer_stops_the_daemon_naming_the_files_it_looked_for(tmp_path):
    model = copy_fixture("tiny-llama", tmp_path / "model")
    (model / "tokenizer.model").unlink()
    code, lines = start_and_fail(tmp_path, model)
    assert code == 1, lines[-5:]
    assert lines[-1] == (f"moebatchd: cannot load model: NOT_FOUND: no tokenizer in {model}: "
                         "expected tokenizer.json (Hugging Face tokenizers) or tokenizer.model "
                         "(sentencepiece)"), lines[-5:]


def unknown_template_model(tmp_path: Path) -> Path:
    """tiny-qwen3's weights with the llama2 BPE tokenizer.json (3,000 tokens, BOS 1, EOS 2, as the
    fixture's config.json) and a tokenizer_config.json whose chat_template no layout matches."""
    assert (LLAMA2_BPE / "tokenizer.json").exists(), (
        f"{LLAMA2_BPE}/tokenizer.json missing: run scripts/fetch_bpe_tokenizers.sh")
    model = copy_fixture("tiny-qwen3", tmp_path / "model")
    (model / "tokenizer.model").unlink()
    shutil.copy(LLAMA2_BPE / "tokenizer.json", model / "tokenizer.json")
    config = json.loads((LLAMA2_BPE / "tokenizer_config.json").read_text())
    config["chat_template"] = UNKNOWN_TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def test_an_unrecognised_chat_template_refuses_chat_jobs_and_keeps_serving(tmp_path):
    model = unknown_template_model(tmp_path)
    golden = json.loads((FIXTURES / "tiny-qwen3" / "golden.jsonl").open().readline())
    assert golden["prompt_token_ids"] == [1]  # the empty prompt: BOS alone, in every tokenizer
    prompts = [completion_line("golden-0", golden["prompt_token_ids"]),
               completion_line("text", "Hello world", max_tokens=4)]
    mixed = prompts[:1] + [chat_line("chat", "Hello")] + prompts[1:]
    d = ModelDaemon(tmp_path / "data", model).start()  # the template does not stop the start
    try:
        client = Client(d.addr, timeout=60)
        # The daemon validates a job whole at CreateJob: the chat line is refused, naming its
        # line, custom_id, --chat_template and the reason, and the job is not created.
        with pytest.raises(ClientError) as e:
            client.create_job(jsonl="\n".join(mixed) + "\n")
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        message = e.value.message
        assert message.startswith(
            '1 of 3 lines is invalid: line 2 (custom_id "chat"): body.messages: '
            f"{model}/tokenizer_config.json: chat_template: not a template moebatch recognises "
            "(it shares no part with the templates moebatch lays out); give --chat_template NAME "
            "with one of: chatml, qwen1.5, qwen2.5, qwen3, smollm2, llama3, llama3.1, llama3.2, "
            "harmony "
            "(or send prompts)"), message
        assert list(client.list_jobs()) == []
        # The prompts run, twice: the daemon keeps serving.
        for _ in range(2):
            job, results = run_job(client, prompts)
            assert state_name(job.state) == "completed" and job.request_counts.failed == 0
            choice = results[0]["response"]["body"]["choices"][0]
            assert choice["token_ids"] == golden["greedy_token_ids"]  # the same weights
            assert results[1]["response"]["status_code"] == 200
            assert results[1]["response"]["body"]["usage"]["completion_tokens"] == 4
        # Token ids beyond the tokenizer's 3,000 but inside config.json's vocab_size (the
        # embedding rows) are accepted, as moebatch-run accepts them, and give the golden tokens.
        records = [json.loads(l) for l in (FIXTURES / "tiny-qwen3" / "golden.jsonl").open()]
        wide = next(r for r in records if max(r["prompt_token_ids"]) >= 3000)
        job, results = run_job(client, [completion_line("wide", wide["prompt_token_ids"])])
        assert state_name(job.state) == "completed" and job.request_counts.failed == 0, results
        choice = results[0]["response"]["body"]["choices"][0]
        assert choice["token_ids"] == wide["greedy_token_ids"]
        assert d.health("moebatch.v1.BatchService") == "SERVING"
    finally:
        d.stop()
    log = d.log.read_text()
    assert "tokenizer: tokenizer.json 3000 tokens, chat layout none (the chat template is not " \
           "recognised)" in log, log[-2000:]
    # The remedy the message names: --chat_template NAME; then the same job runs, chat included.
    d = ModelDaemon(tmp_path / "data2", model, ["--chat-template", "chatml"]).start()
    try:
        client = Client(d.addr, timeout=60)
        job, results = run_job(client, mixed)
        assert state_name(job.state) == "completed" and job.request_counts.failed == 0
        assert results[0]["response"]["body"]["choices"][0]["token_ids"] == \
            golden["greedy_token_ids"]
        chat = results[1]["response"]
        assert chat["status_code"] == 200 and chat["body"]["object"] == "chat.completion"
        assert len(chat["body"]["choices"][0]["token_ids"]) == 8
    finally:
        d.stop()
    assert "chat layout chatml" in d.log.read_text()
