"""Each limit of a real moebatchd tripped in turn: the status code, the limit named in
the message, nothing stored, and the daemon keeps serving everyone else.

Limits: message size (RESOURCE_EXHAUSTED from gRPC), requests per job and max_tokens per request
(INVALID_ARGUMENT), context length (that request fails in the results, status 400), pending jobs
and queued tokens per tenant (RESOURCE_EXHAUSTED).
"""
import json

import grpc
import pytest

from conftest import MODEL, Daemon
from test_security import code_of, make_token

GOLDEN = [json.loads(l) for l in open(MODEL / "golden.jsonl")]


def request(custom_id, prompt_len=8, max_tokens=8):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"prompt": [1] + [100 + i for i in range(prompt_len - 1)],
                     "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}


@pytest.fixture
def limited(tmp_path):
    tokens_file = tmp_path / "tokens.json"
    tokens = {t: make_token(tokens_file, t) for t in ("team-a", "team-b")}
    # One request in flight at a time keeps team-a's big jobs pending while the test runs.
    d = Daemon(tmp_path / "data", [
        "--tokens_file", str(tokens_file), "--max_request_bytes", "200000",
        "--max_requests_per_job", "400", "--max_tokens_per_request", "16",
        "--default_max_tokens", "16", "--max_pending_jobs_per_tenant", "2",
        "--max_queued_tokens_per_tenant", "20000", "--max_in_flight", "1"]).start()
    from moebatch import Client
    clients = {t: Client(d.addr, timeout=30, token=tok) for t, tok in tokens.items()}
    yield d, clients
    d.stop()


def test_each_limit_gives_its_code_and_the_daemon_keeps_serving(limited):
    daemon, c = limited
    a, b = c["team-a"], c["team-b"]

    def refused(call, code, *words):
        got, message = code_of(call)
        assert got == code, message
        for w in words:
            assert w in message, message
        return message

    # Message size: a 300 kB payload against --max_request_bytes 200000.
    big = "\n".join(json.dumps(request(f"r{i}", 200)) for i in range(300))
    assert len(big) > 200000
    refused(lambda: a.create_job(jsonl=big), grpc.StatusCode.RESOURCE_EXHAUSTED, "200000")
    # Requests per job.
    refused(lambda: a.create_job(requests=[request(f"r{i}", 2, 1) for i in range(401)]),
            grpc.StatusCode.INVALID_ARGUMENT, "max_requests_per_job", "400")
    # max_tokens per request, naming the line.
    refused(lambda: a.create_job(requests=[request("ok"), request("big", max_tokens=17)]),
            grpc.StatusCode.INVALID_ARGUMENT, "line 2", "body.max_tokens", "max_tokens_per_request")
    # Queued tokens per tenant: 400 requests of 40 + 16 tokens = 22,400 > 20,000.
    refused(lambda: b.create_job(requests=[request(f"r{i}", 40, 16) for i in range(400)]),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "max_queued_tokens_per_tenant", "team-b", "22400")
    assert list(b.list_jobs()) == []  # nothing stored

    # Pending jobs per tenant: two long jobs of team-a are queued (one request in flight at a
    # time), the third is refused; team-b is still served meanwhile.
    long = [request(f"l{i}", 8, 16) for i in range(300)]  # 300 x 24 = 7,200 tokens each
    j1 = a.create_job(requests=long)
    j2 = a.create_job(requests=long)
    refused(lambda: a.create_job(requests=[request("x")]), grpc.StatusCode.RESOURCE_EXHAUSTED,
            "max_pending_jobs_per_tenant", "team-a")
    # Cancelling frees team-a's slot.
    a.cancel(j1.id)
    a.wait(j1.id)
    j3 = a.create_job(requests=[request("after")])
    a.cancel(j2.id)
    final, _ = a.wait(j3.id)
    assert final.request_counts.completed == 1
    # Context length: that request fails in the results (400, naming the context); the job runs.
    small = b.create_job(requests=[request("fits", 4, 4), request("too-long", 5000, 4)])
    final, _ = b.wait(small.id)
    assert final.request_counts.completed == 1 and final.request_counts.failed == 1
    results = {r["custom_id"]: r for r in b.results(small.id)}
    assert results["too-long"]["response"]["status_code"] == 400
    assert "context" in results["too-long"]["response"]["body"]["error"]["message"]
    assert results["fits"]["response"]["status_code"] == 200
    assert daemon.proc.poll() is None


def test_tenants_take_turns(limited):
    """One tenant's large job does not hold back another tenant: with one request in flight at a
    time, team-b's 3 requests finish after a few more of team-a's 300 (in job order they would
    wait for all of team-a's that remain)."""
    daemon, c = limited
    a, b = c["team-a"], c["team-b"]
    big = a.create_job(requests=[request(f"l{i}", 8, 16) for i in range(300)])
    for p in a.watch(big.id):  # team-a's job is under way
        if p.request_counts.completed >= 5:
            break
    small = b.create_job(requests=[request(f"s{i}", 8, 16) for i in range(3)])
    at_submit = a.get_job(big.id).request_counts.completed
    final, _ = b.wait(small.id)
    assert final.request_counts.completed == 3
    at_finish = a.get_job(big.id).request_counts.completed
    print(f"team-a's requests completed: {at_submit} when team-b submitted, {at_finish} when "
          f"team-b's 3 were done")
    assert at_submit < 300 - 20, "team-a's job was nearly done before team-b came: no test"
    assert at_finish - at_submit <= 8, (at_submit, at_finish)
    a.cancel(big.id)
    a.wait(big.id)
    assert daemon.proc.poll() is None
