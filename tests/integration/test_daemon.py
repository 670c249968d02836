"""moebatchd end to end: the real daemon on loopback, the real Python client (client/python).

Covers submit, watch, results, list, cancel; every kind of bad input; and a
crash (kill -9 mid-job, restart on the same data dir) that loses and duplicates nothing.
"""
import json
import time

import grpc
import pytest

from conftest import MODEL, Daemon
from moebatch import Client, ClientError, state_name

GOLDEN = [json.loads(l) for l in open(MODEL / "golden.jsonl")]


def chat_line(custom_id, text, max_tokens=8, **extra):
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}
    body.update(extra)
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": body})


def golden_line(i):
    g = GOLDEN[i]
    return json.dumps({"custom_id": f"golden-{i}", "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": g["prompt_token_ids"], "temperature": 0,
                                "max_tokens": len(g["greedy_token_ids"]), "ignore_eos": True}})


def wait_done(client, job_id, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.get_job(job_id)
        if state_name(job.state) in ("completed", "failed", "cancelled"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")


def test_submit_watch_results_list(client):
    lines = [golden_line(i) for i in range(len(GOLDEN))] + [chat_line("chat-0", "Hello")]
    job = client.create_job(jsonl="\n".join(lines) + "\n", metadata={"team": "a"})
    assert job.request_counts.total == len(lines)
    progress = list(client.watch(job.id))
    assert progress, "WatchJob sent nothing"
    assert state_name(progress[-1].state) == "completed"
    assert progress[-1].request_counts.completed == len(lines)
    assert progress[-1].generated_tokens >= 32 * len(GOLDEN)
    engine = progress[-1].engine  # the engine's activity rides along (pass counters, S-MBU/S-MFU)
    assert engine.backend == "cpu"
    assert engine.passes > 0 and engine.last_pass_tokens > 0
    assert engine.decode_tokens > 0 and engine.prefill_tokens > 0
    assert engine.kv_blocks_total > 0
    assert 0 < engine.device_busy <= 1 and 0 < engine.cpu_attention_busy <= 1
    assert engine.achieved_gbs > 0 and engine.achieved_tflops > 0
    results = list(client.results(job.id))
    assert [r["custom_id"] for r in results] == [json.loads(l)["custom_id"] for l in lines]
    for i, g in enumerate(GOLDEN):  # the daemon reproduces transformers' greedy tokens
        choice = results[i]["response"]["body"]["choices"][0]
        assert choice["token_ids"] == g["greedy_token_ids"]
        assert choice["text"] == g["greedy_text"]
    jobs = list(client.list_jobs())
    assert [j.id for j in jobs] == [job.id]
    assert dict(jobs[0].metadata) == {"team": "a"}
    assert list(client.list_jobs(state="cancelled")) == []


def test_inline_requests_and_cancel(client):
    reqs = [{"custom_id": f"r{i}", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": f"Tell me a story {i}"}],
                      "max_tokens": 2000, "temperature": 0.8, "seed": i, "ignore_eos": True}}
            for i in range(8)]
    job = client.create_job(requests=reqs)
    # Let it start, then cancel: in-flight sequences stop promptly.
    for p in client.watch(job.id):
        if p.generated_tokens > 0:
            break
    t0 = time.time()
    client.cancel(job.id)
    done = wait_done(client, job.id, timeout=30)
    assert state_name(done.state) == "cancelled"
    assert time.time() - t0 < 10
    c = done.request_counts
    assert c.completed < 8 and c.cancelled > 0
    assert c.completed + c.failed + c.cancelled == c.total == 8
    # Every request has a result line; the dropped ones say why.
    results = list(client.results(job.id, wait=False))
    assert sorted(r["custom_id"] for r in results) == [f"r{i}" for i in range(8)]
    assert sum(1 for r in results if (r.get("error") or {}).get("code") == "batch_cancelled") \
        == c.cancelled
    client.cancel(job.id)  # cancelling a finished job is a no-op
    # The daemon still works after a cancel.
    job2 = client.create_job(jsonl=chat_line("after", "hi") + "\n")
    assert state_name(wait_done(client, job2.id).state) == "completed"
    # A finished job can be deleted, a running one not; deleted is gone.
    long = client.create_job(requests=reqs[:1])
    with pytest.raises(ClientError) as e:
        client.delete_job(long.id)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    client.cancel(long.id)
    client.delete_job(job.id)
    with pytest.raises(ClientError) as e:
        client.get_job(job.id)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("jsonl, field", [
    ("", "requests"),                                            # an empty job
    ("{not json\n", "line 1"),                                    # malformed JSONL
    (json.dumps({"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}), "custom_id"),
    (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                 "body": {"prompt": "x"}}), "url"),                # unknown endpoint
    (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                 "body": {"prompt": "x", "max_tokens": 0}}), "body.max_tokens"),
    (chat_line("dup", "a") + "\n" + chat_line("dup", "b"), "custom_id"),        # duplicate id
    (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"messages": [{"role": "assistant", "content": "x"}]}}), "messages[0]"),
])
def test_bad_input_is_refused_naming_line_and_field(client, jsonl, field):
    with pytest.raises(ClientError) as e:
        client.create_job(jsonl=jsonl)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.value.message
    assert list(client.list_jobs()) == []  # nothing half-created


def test_every_bad_line_is_listed(client):
    """One refusal lists every bad line by its line number in the file (blank lines counted),
    bounded; dict requests are validated by the daemon alone."""
    lines = [chat_line("a", "fine"), "", chat_line("b", "hot", temperature=7000), "   ",
             "{not json", chat_line("a", "again"), chat_line("c", "fine")]
    with pytest.raises(ClientError) as e:
        client.create_job(jsonl="\n".join(lines) + "\n")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    message = e.value.message
    assert message.startswith(
        '3 of 5 lines are invalid: line 3 (custom_id "b"): body.temperature: must be in '
        '[0, 100], got 7000; line 5: invalid JSON: '), message
    assert message.endswith(
        '; line 6 (custom_id "a"): custom_id: duplicate, first used on line 1'), message
    # The same through dict requests: line N is the N-th item.
    with pytest.raises(ClientError) as e:
        client.create_job(requests=[json.loads(chat_line("a", "x")),
                                    {"custom_id": "b", "prompt": "x", "top_p": 5}])
    assert e.value.message == (
        '1 of 2 lines is invalid: line 2 (custom_id "b"): body.top_p: must be in (0, 1], got 5')
    # 1,000 bad lines, each with a 1 KB custom_id: the message stays bounded.
    many = [chat_line("x" * 1000 + str(i), "y", temperature=-1) for i in range(1000)]
    with pytest.raises(ClientError) as e:
        client.create_job(jsonl="\n".join(many))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.message.startswith("1000 of 1000 lines are invalid: line 1 (custom_id ")
    assert e.value.message.endswith(" more") and len(e.value.message) < 8192
    assert list(client.list_jobs()) == []  # nothing half-created


def test_bad_input_bytes_and_sizes(client, daemon):
    # Text that is not UTF-8: a lone surrogate escape (raw non-UTF-8 bytes cannot even travel in a
    # protobuf string field; the client refuses them).
    bad_utf8 = '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "\\ud800"}}'
    with pytest.raises(ClientError) as e:
        client.create_job(jsonl=bad_utf8)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "line 1" in e.value.message
    # Raw bytes that are not UTF-8, from a file: refused by the daemon naming the line.
    bad = daemon.data_dir.parent / "bad.jsonl"
    bad.write_bytes(chat_line("a", "fine").encode() + b'\n{"custom_id": "b\xff"}\n')
    with pytest.raises(ClientError) as e:
        client.create_job(path=bad)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "line 2" in e.value.message
    # An oversized line (over the 1 MiB per-request limit).
    huge = chat_line("big", "x " * 600_000)
    with pytest.raises(ClientError) as e:
        client.create_job(jsonl=huge)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "line 1" in e.value.message
    # Unknown job ids.
    for call in (client.get_job, client.cancel):
        with pytest.raises(ClientError) as e:
            call("job_doesnotexist")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(ClientError) as e:
        list(client.results("job_doesnotexist"))
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_too_long_for_the_context_fails_that_request_only(client):
    # kv-cache-gb 0.25 holds fewer tokens than max_position_embeddings? The context limit is
    # min(4096, KV capacity); a 5000-token prompt exceeds it either way.
    long_prompt = json.dumps({"custom_id": "long", "method": "POST", "url": "/v1/completions",
                              "body": {"prompt": [1] + [100] * 5000, "max_tokens": 4}})
    too_many = json.dumps({"custom_id": "many", "method": "POST", "url": "/v1/completions",
                           "body": {"prompt": "hi", "max_tokens": 100000}})
    job = client.create_job(jsonl="\n".join([chat_line("ok", "hi"), long_prompt, too_many]))
    done = wait_done(client, job.id)
    assert state_name(done.state) == "completed"
    assert done.request_counts.completed == 1 and done.request_counts.failed == 2
    results = {r["custom_id"]: r for r in client.results(job.id)}
    assert results["ok"]["response"]["status_code"] == 200
    assert results["long"]["response"]["status_code"] == 400
    assert "context" in results["long"]["response"]["body"]["error"]["message"]
    assert results["many"]["response"]["body"]["error"]["message"].startswith("body.max_tokens")


def test_kill9_mid_job_loses_and_duplicates_nothing(tmp_path):
    lines = [chat_line(f"q{i:03d}", f"Question number {i}: why?", max_tokens=48, ignore_eos=True)
             for i in range(200)]
    payload = "\n".join(lines) + "\n"

    reference = Daemon(tmp_path / "ref").start()
    try:
        c = Client(reference.addr, timeout=120)
        ref_job = c.create_job(jsonl=payload)
        wait_done(c, ref_job.id, timeout=600)
        want = {r["custom_id"]: r["response"]["body"]["choices"][0]["token_ids"]
                for r in c.results(ref_job.id)}
    finally:
        reference.stop()
    assert len(want) == 200

    d = Daemon(tmp_path / "crash").start()
    c = Client(d.addr, timeout=120)
    job = c.create_job(jsonl=payload)
    for p in c.watch(job.id):
        if p.request_counts.completed >= 20:
            break
    d.kill9()
    d = Daemon(tmp_path / "crash").start()  # same data dir, new port
    try:
        c = Client(d.addr, timeout=120)
        done = wait_done(c, job.id, timeout=600)
        assert state_name(done.state) == "completed" and done.request_counts.completed == 200
        results = list(c.results(job.id))
        ids = [r["custom_id"] for r in results]
        assert len(ids) == 200 and len(set(ids)) == 200
        got = {r["custom_id"]: r["response"]["body"]["choices"][0]["token_ids"] for r in results}
        assert got == want
    finally:
        d.stop()


def _raw_channel_call(addr, method, request_bytes, stream=False):
    channel = grpc.insecure_channel(addr)
    ident = lambda b: b  # noqa: E731  (messages hand-encoded: no extra packages needed)
    if stream:
        call = channel.stream_stream(method, request_serializer=ident, response_deserializer=ident)
        return b"".join(call(iter([request_bytes]), timeout=10))
    return channel.unary_unary(method, request_serializer=ident,
                               response_deserializer=ident)(request_bytes, timeout=10)


def test_health_and_reflection(daemon):
    # grpc.health.v1.Health/Check with an empty HealthCheckRequest: status SERVING (field 1 = 1).
    assert _raw_channel_call(daemon.addr, "/grpc.health.v1.Health/Check", b"") == b"\x08\x01"
    # Server reflection (what grpcurl uses): list_services (field 7, empty string).
    reply = _raw_channel_call(daemon.addr,
                              "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                              b"\x3a\x00", stream=True)
    assert b"moebatch.v1.BatchService" in reply


def test_cli_against_the_daemon(daemon, tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    cli = Path(sys.executable).parent / "moebatch"
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(chat_line(f"c{i}", f"hello {i}") for i in range(5)) + "\n")
    run = lambda *a: subprocess.run([str(cli), "--server", daemon.addr, *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    sub = run("submit", str(src), "--wait")
    assert sub.returncode == 0, sub.stderr
    job_id = json.loads(sub.stdout)["id"]
    out = tmp_path / "out.jsonl"
    assert run("results", job_id, "-o", str(out)).returncode == 0
    assert [json.loads(l)["custom_id"] for l in out.read_text().splitlines()] == \
        [f"c{i}" for i in range(5)]
    status = run("status", job_id)
    assert status.returncode == 0 and "completed" in status.stdout
    assert job_id in run("list").stdout
    missing = run("status", "job_nope")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_config_file_and_dashed_flags(tmp_path):
    config = tmp_path / "moebatchd.json"
    config.write_text(json.dumps({"default-max-tokens": 3, "kv_cache_gb": 0.125}))
    d = Daemon(tmp_path / "data", extra_args=["--config", str(config)]).start()
    try:
        c = Client(d.addr, timeout=60)
        job = c.create_job(jsonl=json.dumps({"custom_id": "a", "method": "POST",
                                             "url": "/v1/completions",
                                             "body": {"prompt": "x", "ignore_eos": True,
                                                      "temperature": 0}}))
        wait_done(c, job.id)
        (r,) = list(c.results(job.id))
        assert r["response"]["body"]["usage"]["completion_tokens"] == 3  # from the config file
    finally:
        d.stop()
    # The command line (conftest passes --kv-cache-gb 0.25) wins over the config's 0.125:
    # 0.25 GiB of 16 KiB f32 blocks.
    assert "KV cache 16384 blocks" in d.log.read_text()
