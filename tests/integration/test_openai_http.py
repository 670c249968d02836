"""The OpenAI Files and Batches API of moebatchd (--http_listen), driven by the official `openai`
Python package from PyPI, unchanged, with only base_url and api_key set: what a script written for
OpenAI's Batch API does, against a real daemon on loopback.
"""
import json
import os
import subprocess
import time
from pathlib import Path

import urllib.error
import urllib.request
import openai
import pytest
from openai import OpenAI

from conftest import Daemon, free_port
from test_security import certs, make_token  # noqa: F401 (certs: a fixture)

TERMINAL = ("completed", "failed", "cancelled", "expired")


def chat_line(custom_id: str, content: str, max_tokens: int = 6, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "temperature": 0, "max_tokens": max_tokens,
                     "messages": [{"role": "user", "content": content}], **body}}


def write_jsonl(path: Path, lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


class HttpDaemon(Daemon):
    def __init__(self, data_dir: Path, extra_args=(), **kw):
        self.http_port = free_port()
        super().__init__(data_dir, ["--http_listen", f"127.0.0.1:{self.http_port}",
                                    *extra_args], **kw)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1"

    def openai(self, api_key: str = "unused") -> OpenAI:
        return OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture
def http_daemon(tmp_path):
    d = HttpDaemon(tmp_path / "data").start()
    yield d
    d.stop()


def wait_done(client: OpenAI, batch_id: str, timeout: float = 120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in TERMINAL:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not finish: {batch}")


def run_batch(client: OpenAI, path: Path, endpoint="/v1/chat/completions", **kw):
    file = client.files.create(file=path.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint=endpoint,
                                  completion_window="24h", **kw)
    return file, batch


def test_a_script_written_for_openai_runs_a_batch_and_matches_the_grpc_results(
        http_daemon, tmp_path):
    client = http_daemon.openai()
    assert [m.id for m in client.models.list()] == ["tiny-mixtral"]
    lines = [chat_line(f"req-{i}", f"Tell me about the number {i}.") for i in range(5)]
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    file, batch = run_batch(client, path, metadata={"purpose": "test"})
    assert file.bytes == path.stat().st_size and file.purpose == "batch"
    assert client.files.content(file.id).content == path.read_bytes()
    assert batch.status in ("validating", "in_progress", "completed")
    assert batch.input_file_id == file.id and batch.metadata == {"purpose": "test"}
    batch = wait_done(client, batch.id)
    assert batch.status == "completed"
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (5, 5, 0)
    assert batch.completed_at >= batch.in_progress_at >= batch.created_at
    assert abs(batch.expires_at - batch.created_at - 24 * 3600) <= 1
    assert batch.output_file_id and batch.error_file_id is None
    output = client.files.content(batch.output_file_id).text
    http_results = {r["custom_id"]: r for r in map(json.loads, output.splitlines())}
    assert sorted(http_results) == sorted(l["custom_id"] for l in lines)
    for r in http_results.values():
        body = r["response"]["body"]
        assert r["response"]["status_code"] == 200 and r["error"] is None
        # body.model names OpenAI's model; the daemon answers with its own.
        assert body["model"] == "tiny-mixtral"
        assert body["choices"][0]["message"]["content"]
    meta = client.files.retrieve(batch.output_file_id)
    assert meta.purpose == "batch_output" and meta.bytes == len(output.encode())

    # The same requests through gRPC give the same tokens (greedy), and the batch is a job there.
    from moebatch import Client
    grpc_client = Client(http_daemon.addr, timeout=60)
    job = grpc_client.get_job(batch.id)
    assert job.request_counts.completed == 5 and job.input_file_id == file.id
    grpc_job = grpc_client.create_job(jsonl=path.read_bytes())
    grpc_results = {r["custom_id"]: r for r in grpc_client.results(grpc_job.id, wait=True)}
    for cid, r in http_results.items():
        assert (r["response"]["body"]["choices"][0]["token_ids"] ==
                grpc_results[cid]["response"]["body"]["choices"][0]["token_ids"])
    # ... and a job made over gRPC is a batch over HTTP.
    assert client.batches.retrieve(grpc_job.id).request_counts.completed == 5


def test_cancel_a_running_batch_counts_add_up(http_daemon, tmp_path):
    client = http_daemon.openai()
    lines = [chat_line(f"c{i}", f"Count to {i}", max_tokens=1500, ignore_eos=True)
             for i in range(48)]
    _, batch = run_batch(client, write_jsonl(tmp_path / "in.jsonl", lines))
    time.sleep(0.5)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    assert cancelled.cancelling_at is not None
    batch = wait_done(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    c = batch.request_counts
    assert c.total == 48 and c.cancelled > 0
    assert c.completed + c.failed + c.cancelled == c.total
    # Every request appears once, in the output or the error file; the dropped ones say why.
    seen = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            seen += [json.loads(l) for l in client.files.content(file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in seen) == sorted(l["custom_id"] for l in lines)
    dropped = [r for r in seen if r["error"] and r["error"]["code"] == "batch_cancelled"]
    assert len(dropped) == c.cancelled


def test_list_batches_and_files_with_pagination(http_daemon, tmp_path):
    client = http_daemon.openai()
    path = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "Hi", max_tokens=2)])
    made = [run_batch(client, path)[1].id for _ in range(3)]
    first = client.batches.list(limit=2)
    assert len(first.data) == 2 and first.has_more
    assert [b.id for b in first.data] == made[::-1][:2]  # newest first
    all_ids = [b.id for b in client.batches.list(limit=1)]  # the SDK follows `after`
    assert all_ids == made[::-1]
    files = client.files.list(purpose="batch")
    assert len(files.data) == 3
    page = client.files.list(limit=1, order="asc")
    assert page.data[0].id == files.data[-1].id


def _raw_files(client: OpenAI, **params) -> dict:
    """GET /v1/files as the daemon answered it (JSON), through the SDK."""
    return client.files.with_raw_response.list(**params).http_response.json()


def _raw_file(client: OpenAI, file_id: str) -> dict:
    return client.files.with_raw_response.retrieve(file_id).http_response.json()


def _batch_with_errors(client: OpenAI, tmp_path: Path, name: str, ok: int = 2):
    """A finished batch with `ok` successful lines and one failed line (its max_tokens exceed the
    context): it has an output and an error file."""
    lines = [chat_line(f"{name}-{i}", f"Say {i}", max_tokens=2) for i in range(ok)]
    lines.append(chat_line(f"{name}-long", "Hi", max_tokens=10_000_000))
    file, batch = run_batch(client, write_jsonl(tmp_path / f"{name}.jsonl", lines))
    batch = wait_done(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (ok, 1)
    assert batch.output_file_id and batch.error_file_id
    return file, batch


def test_files_list_has_the_batch_output_and_error_files(http_daemon, tmp_path):
    client = http_daemon.openai()
    file, batch = _batch_with_errors(client, tmp_path, "a")
    output, error = batch.output_file_id, batch.error_file_id
    listing = _raw_files(client)
    assert listing["object"] == "list" and listing["has_more"] is False
    listed = {f["id"]: f for f in listing["data"]}
    assert set(listed) == {file.id, output, error}
    # Each entry is exactly what GET /v1/files/{id} answers, through the SDK too.
    for file_id in listed:
        assert listed[file_id] == _raw_file(client, file_id)
        assert (client.files.retrieve(file_id).model_dump() ==
                next(f for f in client.files.list() if f.id == file_id).model_dump())
    assert listed[output]["purpose"] == listed[error]["purpose"] == "batch_output"
    assert listed[output]["created_at"] == listed[error]["created_at"] == batch.completed_at
    assert listed[output]["bytes"] == len(client.files.content(output).content) > 0
    assert listed[error]["bytes"] == len(client.files.content(error).content) > 0
    assert listed[file.id]["purpose"] == "batch"
    # Newest first: the views (made when the batch finished) are not older than the upload.
    ids = [f["id"] for f in listing["data"]]
    assert ids.index(file.id) == 2
    # purpose filters: uploads only, views only.
    assert [f.id for f in client.files.list(purpose="batch")] == [file.id]
    assert sorted(f.id for f in client.files.list(purpose="batch_output")) == sorted([output,
                                                                                      error])
    assert client.files.list(purpose="fine-tune").data == []
    # An unfinished batch has no files yet; a batch that failed validation never has.
    _, bad = run_batch(client, write_jsonl(tmp_path / "bad.jsonl", ["not json"]))
    assert client.batches.retrieve(bad.id).status == "failed"
    assert {f.id for f in client.files.list(purpose="batch_output")} == {output, error}
    # An unknown cursor is the error it always was.
    with pytest.raises(openai.BadRequestError) as e:
        client.files.list(after="file-job_nope-output")
    assert e.value.body["param"] == "after"


def test_files_list_pages_through_uploads_and_views_once_each_in_order(http_daemon, tmp_path):
    client = http_daemon.openai()
    for name in ("a", "b", "c"):
        _batch_with_errors(client, tmp_path, name, ok=1)
        time.sleep(1.1)  # distinct seconds as well as ties within one
    client.files.create(file=write_jsonl(tmp_path / "late.jsonl",
                                         [chat_line("z", "Hi")]).open("rb"), purpose="batch")
    everything = _raw_files(client)["data"]
    assert len(everything) == 3 * 3 + 1
    want_desc = [f["id"] for f in sorted(everything, key=lambda f: (f["created_at"], f["id"]),
                                         reverse=True)]
    assert [f["id"] for f in everything] == want_desc  # (created_at, id), newest first
    for order, want in (("desc", want_desc), ("asc", want_desc[::-1])):
        # By hand, one file a page: has_more until the last, each file once.
        walked, after = [], None
        while True:
            params = {"limit": 1, "order": order, **({"after": after} if after else {})}
            page = _raw_files(client, **params)
            assert len(page["data"]) == 1
            walked.append(page["data"][0]["id"])
            assert page["first_id"] == page["last_id"] == walked[-1]
            after = walked[-1]
            if not page["has_more"]:
                break
            assert len(walked) < 20
        assert walked == want, order
        # The SDK follows `after` itself.
        assert [f.id for f in client.files.list(limit=1, order=order)] == want, order
        assert [f.id for f in client.files.list(limit=4, order=order)] == want, order
        # Views only, paged by a view's id; uploads only, paged by an upload's id.
        views = [i for i in want if i.startswith("file-job_")]
        assert [f.id for f in client.files.list(purpose="batch_output", limit=2,
                                                order=order)] == views
        uploads = [i for i in want if not i.startswith("file-job_")]
        assert [f.id for f in client.files.list(purpose="batch", limit=1,
                                                order=order)] == uploads
    # A cursor of either kind works with either filter.
    first_view = next(i for i in want_desc if i.startswith("file-job_"))
    rest = want_desc[want_desc.index(first_view) + 1:]
    assert [f.id for f in client.files.list(after=first_view)] == rest
    assert ([f.id for f in client.files.list(after=first_view, purpose="batch")] ==
            [i for i in rest if not i.startswith("file-job_")])


def test_bad_files_fail_validation_listing_every_bad_line(http_daemon, tmp_path):
    client = http_daemon.openai()
    good = chat_line("ok", "Hi")
    lines = [
        good,
        "this is not json",
        chat_line("ok", "duplicate id"),
        {"custom_id": "u", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "Hi", "max_tokens": 2}},
        chat_line("t", "Hi", temperature=-1),
        {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
    ]
    _, batch = run_batch(client, write_jsonl(tmp_path / "bad.jsonl", lines))
    assert batch.status == "failed" and batch.failed_at is not None
    errors = {e.line: e for e in batch.errors.data}
    assert sorted(errors) == [2, 3, 4, 5, 6]
    assert errors[2].code == "invalid_json_line"
    assert errors[3].code == "duplicate_custom_id" and errors[3].param == "custom_id"
    assert errors[4].code == "invalid_url" and errors[4].param == "url"
    assert errors[5].param == "body.temperature"
    assert errors[6].param == "url"
    # It stays failed and listed; nothing ran.
    again = client.batches.retrieve(batch.id)
    assert again.status == "failed" and again.request_counts.total == 0
    assert again.output_file_id is None


def test_bad_requests_get_openai_errors_naming_the_parameter(http_daemon, tmp_path):
    client = http_daemon.openai()
    path = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "Hi")])
    file = client.files.create(file=path.open("rb"), purpose="batch")
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    assert e.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                              completion_window="soon")
    assert e.value.body["param"] == "completion_window"
    with pytest.raises(openai.NotFoundError) as e:
        client.batches.create(input_file_id="file-000000000000000000000000",
                              endpoint="/v1/chat/completions", completion_window="24h")
    assert e.value.body["param"] == "input_file_id"
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=path.open("rb"), purpose="fine-tune")
    assert e.value.body["param"] == "purpose"
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("job_000000000000000000000000")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-job_000000000000000000000000-output")
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    efile = client.files.create(file=empty.open("rb"), purpose="batch")
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=efile.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    assert e.value.body["param"] == "input_file_id"
    # Unknown paths and raw bad bodies answer OpenAI's error object too.
    for url, data, status in ((f"{http_daemon.base_url}/batches", b"{not json", 400),
                              (f"{http_daemon.base_url}/nothing/here", None, 404)):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30)
        assert e.value.code == status
        assert json.loads(e.value.read())["error"]["type"] == "invalid_request_error"


def test_deleting_files_and_results(http_daemon, tmp_path):
    client = http_daemon.openai()
    path = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "Hi", max_tokens=2)])
    file, batch = run_batch(client, path)
    batch = wait_done(client, batch.id)
    assert batch.output_file_id in [f.id for f in client.files.list()]
    assert client.files.delete(batch.output_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.content(batch.output_file_id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(batch.output_file_id)
    assert client.batches.retrieve(batch.id).output_file_id is None
    # Gone from the listing as well, and no cursor any more.
    assert [f.id for f in client.files.list()] == [file.id]
    assert client.files.list(purpose="batch_output").data == []
    with pytest.raises(openai.BadRequestError):
        client.files.list(after=batch.output_file_id)
    assert client.files.delete(file.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file.id)
    assert not (http_daemon.data_dir / "files" / file.id).exists()


def test_another_tenants_ids_are_not_found(tmp_path):
    tokens_file = tmp_path / "tokens.json"
    a, b = make_token(tokens_file, "team-a"), make_token(tokens_file, "team-b")
    admin_token = make_token(tokens_file, "ops", role="admin")
    d = HttpDaemon(tmp_path / "data", ["--tokens_file", str(tokens_file)]).start()
    try:
        path = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "Hi", max_tokens=2)])
        file, batch = run_batch(d.openai(a), path)
        batch = wait_done(d.openai(a), batch.id)
        other = d.openai(b)
        for call in (lambda: other.batches.retrieve(batch.id),
                     lambda: other.batches.cancel(batch.id),
                     lambda: other.files.retrieve(file.id),
                     lambda: other.files.content(file.id),
                     lambda: other.files.delete(file.id),
                     lambda: other.files.content(batch.output_file_id),
                     lambda: other.batches.create(input_file_id=file.id,
                                                  endpoint="/v1/chat/completions",
                                                  completion_window="24h")):
            with pytest.raises(openai.NotFoundError):
                call()
        assert other.batches.list().data == [] and other.files.list().data == []
        assert other.files.list(purpose="batch_output").data == []
        with pytest.raises(openai.BadRequestError):
            other.files.list(after=batch.output_file_id)
        # The owner lists its batch's output file; an admin lists every tenant's.
        assert ({f.id for f in d.openai(a).files.list()} ==
                {file.id, batch.output_file_id})
        admin = d.openai(admin_token)
        assert batch.output_file_id in {f.id for f in admin.files.list(purpose="batch_output")}
        with pytest.raises(openai.AuthenticationError):
            d.openai("not-a-token").batches.list()
        stranger = d.openai("not-a-token")
        for _ in range(2):  # the refused upload's body does not spoil the next request
            with pytest.raises(openai.AuthenticationError):
                stranger.files.create(file=path.open("rb"), purpose="batch")
    finally:
        d.stop()


def test_kill9_during_an_http_batch_loses_and_duplicates_nothing(tmp_path):
    d = HttpDaemon(tmp_path / "data", ["--max_in_flight", "8"]).start()
    client = d.openai()
    lines = [chat_line(f"k{i}", f"Story {i}", max_tokens=200, ignore_eos=True)
             for i in range(40)]
    _, batch = run_batch(client, write_jsonl(tmp_path / "in.jsonl", lines))
    deadline = time.time() + 60
    while client.batches.retrieve(batch.id).request_counts.completed < 5:
        assert time.time() < deadline
        time.sleep(0.05)
    d.kill9()
    d.start()
    batch = wait_done(client, batch.id, timeout=300)
    assert batch.status == "completed" and batch.request_counts.completed == 40
    out = [json.loads(l) for l in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in out) == sorted(l["custom_id"] for l in lines)
    d.stop()


def _hwm_kib(daemon) -> int:
    return daemon.memory_kib()["VmHWM"]


def test_uploads_and_downloads_stream_a_200_mb_file(http_daemon, tmp_path):
    path = tmp_path / "big.jsonl"
    line = json.dumps(chat_line("x" * 40, "word " * 200)) + "\n"
    with path.open("w") as f:
        n = (200 << 20) // len(line) + 1
        for i in range(n):
            f.write(line)
    size = path.stat().st_size
    assert size >= 200 << 20
    before = _hwm_kib(http_daemon)
    client = http_daemon.openai()
    with path.open("rb") as f:
        file = client.files.create(file=f, purpose="batch")
    assert file.bytes == size
    got = 0
    with urllib.request.urlopen(f"{http_daemon.base_url}/files/{file.id}/content",
                                timeout=120) as r:
        assert r.status == 200
        while chunk := r.read(1 << 20):
            got += len(chunk)
    assert got == size
    growth_mib = (_hwm_kib(http_daemon) - before) / 1024
    print(f"peak RSS growth over a {size >> 20} MiB upload and download: {growth_mib:.1f} MiB")
    assert growth_mib < 32, f"peak RSS grew {growth_mib:.1f} MiB: the file sat in memory"


def test_an_upload_over_the_limit_is_413(tmp_path):
    d = HttpDaemon(tmp_path / "data", ["--max_upload_bytes", "1000"]).start()
    try:
        path = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "Hi") for i in range(20)])
        with pytest.raises(openai.APIStatusError) as e:
            d.openai().files.create(file=path.open("rb"), purpose="batch")
        assert e.value.status_code == 413
        assert list((d.data_dir / "files").iterdir()) == []
    finally:
        d.stop()


def test_litellm_passes_a_batch_through(http_daemon, tmp_path):
    """LiteLLM's create_file / create_batch / retrieve_batch / file_content / list_batches with
    custom_llm_provider="openai" and api_base at the daemon (scripts/test.sh installs LiteLLM in a
    venv of its own and names its python in MOEBATCH_LITELLM_PYTHON)."""
    python = os.environ.get("MOEBATCH_LITELLM_PYTHON")
    if not python:
        pytest.skip("MOEBATCH_LITELLM_PYTHON is not set (scripts/test.sh sets it)")
    lines = [chat_line(f"l{i}", f"Hello {i}") for i in range(3)]
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    script = Path(__file__).parent / "tools" / "litellm_batch.py"
    out = subprocess.run([python, str(script), http_daemon.base_url, "unused", str(path)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["status"] == "completed"
    assert got["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert got["id"] in got["listed"]
    assert sorted(json.loads(l)["custom_id"] for l in got["output"]) == ["l0", "l1", "l2"]
    batch = http_daemon.openai().batches.retrieve(got["id"])
    assert batch.metadata == {"via": "litellm"}


def test_a_batch_past_its_completion_window_expires(http_daemon, tmp_path):
    client = http_daemon.openai()
    lines = [chat_line(f"x{i}", f"Go on {i}", max_tokens=3000, ignore_eos=True)
             for i in range(32)]
    file = client.files.create(file=write_jsonl(tmp_path / "in.jsonl", lines).open("rb"),
                               purpose="batch")
    # OpenAI's windows are "24h"; moebatchd also takes seconds, minutes and days.
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                  completion_window="2s")
    assert batch.expires_at - batch.created_at in (2, 3)
    batch = wait_done(client, batch.id, timeout=60)
    assert batch.status == "expired" and batch.expired_at >= batch.expires_at
    c = batch.request_counts
    assert c.completed + c.failed == c.total == 32 and c.failed > 0
    errors = [json.loads(l) for l in client.files.content(batch.error_file_id).text.splitlines()]
    assert len(errors) == c.failed
    assert all(e["error"]["code"] == "batch_expired" for e in errors)


def test_https_with_the_grpc_certificate(tmp_path, certs):
    import ssl
    d = HttpDaemon(tmp_path / "data", ["--tls_cert", str(certs / "server.pem"), "--tls_key",
                                       str(certs / "server.key")], tls_ca=certs / "ca.pem").start()
    try:
        url = f"https://127.0.0.1:{d.http_port}/v1"
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        client = OpenAI(base_url=url, api_key="unused", max_retries=0,
                        http_client=openai.DefaultHttpxClient(verify=context))
        path = write_jsonl(tmp_path / "in.jsonl", [chat_line("s", "Hi", max_tokens=2)])
        file, batch = run_batch(client, path)
        assert wait_done(client, batch.id).status == "completed"
        # Plain HTTP to the HTTPS port, or a client that does not trust the CA, gets nothing.
        with pytest.raises(openai.APIConnectionError):
            OpenAI(base_url=f"http://127.0.0.1:{d.http_port}/v1", api_key="x",
                   max_retries=0).models.list()
        with pytest.raises(openai.APIConnectionError):
            OpenAI(base_url=url, api_key="x", max_retries=0).models.list()
    finally:
        d.stop()


def test_tenant_limits_answer_429(tmp_path):
    d = HttpDaemon(tmp_path / "data", ["--max_pending_jobs_per_tenant", "1"]).start()
    try:
        client = d.openai()
        long = write_jsonl(tmp_path / "long.jsonl",
                           [chat_line("l", "Go", max_tokens=3000, ignore_eos=True)])
        _, first = run_batch(client, long)
        with pytest.raises(openai.RateLimitError) as e:
            run_batch(client, long)
        assert "max_pending_jobs_per_tenant" in e.value.body["message"]
        client.batches.cancel(first.id)
    finally:
        d.stop()


def test_logprobs_and_n_through_the_http_api(http_daemon, tmp_path):
    client = http_daemon.openai()
    lines = [chat_line("lp", "Hi", max_tokens=4, logprobs=True, top_logprobs=3, n=2),
             {"custom_id": "c", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "Once upon", "max_tokens": 3, "temperature": 0, "logprobs": 2}}]
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    file = client.files.create(file=path.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    # One endpoint per batch: the completions line fails validation, naming url.
    assert batch.status == "failed" and [e.param for e in batch.errors.data] == ["url"]
    path = write_jsonl(tmp_path / "chat.jsonl", lines[:1])
    _, batch = run_batch(client, path)
    batch = wait_done(client, batch.id)
    [out] = [json.loads(l) for l in client.files.content(batch.output_file_id).text.splitlines()]
    body = out["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["message"] == body["choices"][1]["message"]  # greedy: the same
    assert body["usage"]["completion_tokens"] == 8
    for choice in body["choices"]:
        content = choice["logprobs"]["content"]
        assert len(content) == 4
        for entry in content:
            assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
            assert entry["logprob"] == max(t["logprob"] for t in entry["top_logprobs"])


def responses_line(custom_id: str, input, max_output_tokens: int = 6, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
            "body": {"model": "gpt-4o-mini", "temperature": 0, "input": input,
                     "max_output_tokens": max_output_tokens, **body}}


def test_a_responses_batch_gives_openai_response_objects_with_the_chat_tokens(
        http_daemon, tmp_path):
    from openai.types.responses import Response
    client = http_daemon.openai()
    lines = [
        responses_line("s", "Tell me about the number 7."),
        responses_line("i", [{"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": "Hello"}]}],
                       instructions="Be brief."),
        responses_line("lp", "Hi", max_output_tokens=3, top_logprobs=2),
        responses_line("json", "Give me JSON.", max_output_tokens=40, temperature=1, seed=3,
                       text={"format": {"type": "json_object"}}),
    ]
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    _, batch = run_batch(client, path, endpoint="/v1/responses")
    assert batch.endpoint == "/v1/responses"
    batch = wait_done(client, batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 4
    out = {r["custom_id"]: r for r in map(json.loads,
                                          client.files.content(batch.output_file_id).text
                                          .splitlines())}
    responses = {}
    for cid, r in out.items():
        assert r["response"]["status_code"] == 200 and r["error"] is None
        body = r["response"]["body"]
        # The SDK's own model of a Response accepts the body as it is.
        resp = Response.model_validate(body)
        assert resp.object == "response" and resp.id.startswith("resp_")
        assert resp.model == "tiny-mixtral"
        assert resp.usage.output_tokens <= resp.max_output_tokens
        if resp.status == "incomplete":  # cut by max_output_tokens
            assert resp.usage.output_tokens == resp.max_output_tokens
            assert resp.incomplete_details.reason == "max_output_tokens"
        else:
            assert resp.status == "completed" and resp.incomplete_details is None
        assert resp.output_text == resp.output[0].content[0].text
        assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
        assert len(body["token_ids"]) == resp.usage.output_tokens
        responses[cid] = (resp, body)
    assert responses["i"][0].instructions == "Be brief."
    # JSON mode: the text is a JSON object, or (cut by max_output_tokens) begins one.
    json_resp = responses["json"][0]
    assert json_resp.output_text.lstrip().startswith("{")
    if json_resp.status == "completed":
        assert isinstance(json.loads(json_resp.output_text), dict)
    assert responses["s"][0].max_output_tokens == 6 and responses["s"][0].temperature == 0
    logprobs = responses["lp"][0].output[0].content[0].logprobs
    assert len(logprobs) == responses["lp"][0].usage.output_tokens
    for entry in logprobs:
        assert len(entry.top_logprobs) == 2
        assert entry.logprob == max(t.logprob for t in entry.top_logprobs)

    # The same conversations as chat requests (instructions as the system message) give the same
    # prompt and the same greedy tokens.
    chat = [chat_line("s", "Tell me about the number 7."),
            {**chat_line("i", "Hello"),
             "body": {**chat_line("i", "Hello")["body"],
                      "messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Hello"}]}},
            chat_line("lp", "Hi", max_tokens=3)]
    _, chat_batch = run_batch(client, write_jsonl(tmp_path / "chat.jsonl", chat))
    chat_batch = wait_done(client, chat_batch.id)
    for r in map(json.loads, client.files.content(chat_batch.output_file_id).text.splitlines()):
        resp, body = responses[r["custom_id"]]
        choice = r["response"]["body"]["choices"][0]
        assert body["token_ids"] == choice["token_ids"]
        assert resp.output_text == choice["message"]["content"]
        assert resp.usage.input_tokens == r["response"]["body"]["usage"]["prompt_tokens"]


def test_a_responses_batch_with_chat_fields_fails_validation_naming_them(http_daemon, tmp_path):
    client = http_daemon.openai()
    lines = [responses_line("ok", "Hi"),
             {**responses_line("mt", "Hi"), "body": {"input": "Hi", "max_tokens": 5}},
             responses_line("img", [{"role": "user", "content": [{"type": "input_image"}]}]),
             chat_line("chat", "Hi"),
             responses_line("json", "Hi", text={"format": {"type": "json_schema", "name": "x",
                                                           "schema": {"type": "object"}}})]
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    _, batch = run_batch(client, path, endpoint="/v1/responses")
    assert batch.status == "failed"
    assert [(e.line, e.param) for e in batch.errors.data] == [
        (2, "body.max_tokens"), (3, "body.input[0].content[0].type"), (4, "url"),
        (5, "body.text.format.type")]
    assert "use body.max_output_tokens" in batch.errors.data[0].message
