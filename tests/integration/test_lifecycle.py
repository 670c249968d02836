"""The daemon's life cycle: NOT_SERVING while the model loads, graceful drain on SIGTERM
(in-flight sequences finish and commit, exit 0, the next start resumes), a drain that times out,
and no new jobs while draining.
"""
import json
import shutil
import signal
import subprocess
import time

import grpc

from conftest import BUILD, MODEL, ROOT, Daemon, free_port


def request(custom_id, max_tokens=48):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"prompt": [1, 100 + len(custom_id), 200], "max_tokens": max_tokens,
                     "temperature": 0, "ignore_eos": True}}


def client(daemon):
    from moebatch import Client
    return Client(daemon.addr, timeout=30)


def wait_for_results(c, job_id, n, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = c.get_job(job_id)
        if job.request_counts.completed >= n:
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not reach {n} results")


def test_not_serving_while_the_model_loads(tmp_path):
    # A model that takes seconds to build: one synthetic Mixtral-8x7B layer (~3 GB of bf16
    # weights generated on the host) with the real Mixtral tokenizer.
    model = tmp_path / "mixtral-1-layer"
    model.mkdir()
    shutil.copy(ROOT / "bench" / "models" / "mixtral-8x7b" / "config.json", model)
    shutil.copy(MODEL / "tokenizer.model", model)
    port = free_port()
    d = Daemon(tmp_path / "data", ["--weights", "synthetic", "--synthetic_layers", "1",
                                   "--weight_dtype", "bf16"])
    d.port, d.addr = port, f"127.0.0.1:{port}"
    d.data_dir.mkdir(parents=True)
    log = open(d.log, "ab")
    d.proc = subprocess.Popen(
        [str(BUILD / "server" / "moebatchd"), "--model", str(model), "--listen", d.addr,
         "--data-dir", str(d.data_dir), "--kv-cache-gb", "0.25", "--weights", "synthetic",
         "--synthetic_layers", "1", "--weight_dtype", "bf16"], stdout=log, stderr=log)
    try:
        seen = []
        loading_error = None
        deadline = time.time() + 300
        while time.time() < deadline:
            assert d.proc.poll() is None, d.log.read_text()[-2000:]
            status = d.health()
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == "NOT_SERVING" and loading_error is None:
                from moebatch import ClientError
                try:
                    client(d).create_job(requests=[request("early")])
                except ClientError as e:
                    loading_error = e
            if status == "SERVING":
                break
            time.sleep(0.05)
        assert "NOT_SERVING" in seen, seen
        assert seen[-1] == "SERVING", seen
        assert seen.index("NOT_SERVING") < seen.index("SERVING")
        assert d.health("moebatch.v1.BatchService") == "SERVING"
        assert loading_error is not None and loading_error.code == grpc.StatusCode.UNAVAILABLE
        assert "loading" in loading_error.message
        # Reading the store needs no model: it answered while loading (an empty list then).
        assert list(client(d).list_jobs()) == []
    finally:
        d.stop()
    assert d.proc.returncode == 0


def test_sigterm_drains_in_flight_sequences_then_exits_0_and_resumes(tmp_path):
    d = Daemon(tmp_path / "data", ["--max_in_flight", "8", "--drain_timeout_s", "60"]).start()
    c = client(d)
    job = c.create_job(requests=[request(f"r{i:03d}") for i in range(200)])
    wait_for_results(c, job.id, 10)
    t0 = time.time()
    d.proc.send_signal(signal.SIGTERM)
    # While draining: health NOT_SERVING and new jobs refused with UNAVAILABLE (the in-flight
    # sequences take a moment to finish their 48 tokens each).
    from moebatch import ClientError
    refused = None
    for _ in range(100):
        try:
            c.create_job(requests=[request("late")])
        except ClientError as e:
            refused = e
            break
        time.sleep(0.01)
    assert refused is not None
    assert refused.code == grpc.StatusCode.UNAVAILABLE, refused
    assert d.proc.wait(timeout=60) == 0
    took = time.time() - t0
    log = d.log.read_text()
    assert "drained: every in-flight request committed" in log, log[-3000:]
    assert "shutting down" in refused.message or "Socket closed" in refused.message or \
        "connect" in refused.message.lower(), refused.message

    # Restart: the job resumes and finishes with every custom_id exactly once.
    d.start()
    try:
        c = client(d)
        committed_before = None
        final, _ = c.wait(job.id)
        results = list(c.results(job.id))
        ids = [r["custom_id"] for r in results]
        assert sorted(ids) == [f"r{i:03d}" for i in range(200)]
        assert all(r["response"]["status_code"] == 200 for r in results)
        assert all(len(r["response"]["body"]["choices"][0]["token_ids"]) == 48 for r in results)
        del committed_before
    finally:
        d.stop()
    print(f"drain took {took:.2f} s")


def test_a_drain_that_times_out_leaves_the_rest_pending(tmp_path):
    # Long sequences (2,000 tokens each, 16 in flight) cannot finish in 0.2 s.
    d = Daemon(tmp_path / "data", ["--max_in_flight", "16", "--drain_timeout_s", "0.2"]).start()
    c = client(d)
    job = c.create_job(requests=[request(f"r{i:02d}", 2000) for i in range(32)])
    time.sleep(0.5)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=60) == 0
    log = d.log.read_text()
    assert "still in flight after 0.2 s; they run again on the next start" in log, log[-3000:]
    d.start()
    try:
        c = client(d)
        final, _ = c.wait(job.id)
        assert final.request_counts.completed == 32
        ids = [r["custom_id"] for r in c.results(job.id)]
        assert ids == [f"r{i:02d}" for i in range(32)]
    finally:
        d.stop()
