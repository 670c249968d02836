"""A fake moebatchd for the client's own unit tests: an in-process gRPC server implementing
BatchService (the generated servicer base class) with canned behaviour, on loopback.

It is not the daemon: the integration tests against the real moebatchd live elsewhere. Canned
behaviour:
  * CreateJob: refuses an empty job (INVALID_ARGUMENT), and a job with bad lines as the daemon
    does (INVALID_ARGUMENT "K of N lines are invalid: line L (custom_id "x"): MESSAGE; ..."):
    lines that are not JSON objects, and lines whose custom_id the test put in `line_errors`
    (custom_id -> the daemon's message for it; the fake knows no field rules). Otherwise stores a
    job in IN_PROGRESS with one request per inline request or non-blank JSONL line; records every
    request it receives.
  * GetJob / CancelJob / WatchJob / GetResults: NOT_FOUND "job <id> not found" for unknown ids.
  * WatchJob: 0/N .. N/N progress messages, then COMPLETED (the job's state becomes COMPLETED,
    with the daemon's figures: started_at, tokens, rate, elapsed seconds). Each request may
    generate 4 tokens (max_tokens_total 4 N) and generates 4 by the time it is done, 2 while
    running. A job already terminal gets one message, its final state, at once.
    Jobs with special ids misbehave: "job_broken" aborts with INTERNAL after one message,
    "job_flaky" answers UNAVAILABLE on the first watch, "job_doomed" (or metadata fake_outcome=cancelled|failed) ends
    CANCELLED (or FAILED),
    "job_slow" makes GetJob take 2 s, "job_endless" streams until the client cancels.
  * GetResults: one Result per request, in order; without `wait` only the first two.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent import futures

import grpc
import pytest

from moebatch.v1 import batch_pb2 as pb
from moebatch.v1 import batch_pb2_grpc as pb_grpc


def result_line(job_id: str, index: int, custom_id: str) -> str:
    return json.dumps({
        "id": f"batch_req_{job_id}_{index}", "custom_id": custom_id,
        "response": {"status_code": 200, "body": {"choices": [{
            "index": 0, "message": {"role": "assistant", "content": f"answer {index}"},
            "finish_reason": "length", "token_ids": [100 + index, 7]}]}},
        "error": None,
    })


class FakeBatchService(pb_grpc.BatchServiceServicer):
    def __init__(self):
        self.lock = threading.Lock()
        self.jobs: dict[str, pb.Job] = {}
        self.custom_ids: dict[str, list[str]] = {}
        self.calls: list[tuple[str, object]] = []
        self.loading_checks = 0  # health checks answered NOT_SERVING before SERVING
        self.flaky_failures = 1
        self.stream_cancelled = threading.Event()
        self.next_id = 1
        self.line_errors: dict[str, str] = {}  # custom_id -> a canned validation message

    def add_job(self, job_id: str, total: int = 3, state: int = pb.JOB_STATE_IN_PROGRESS,
                created_at: int = 1_700_000_000) -> pb.Job:
        job = pb.Job(id=job_id, state=state, model="tiny-mixtral", created_at=created_at,
                     request_counts=pb.RequestCounts(total=total))
        with self.lock:
            self.jobs[job_id] = job
            self.custom_ids[job_id] = [f"req-{i}" for i in range(total)]
        return job

    def _job(self, job_id: str, context) -> pb.Job:
        with self.lock:
            job = self.jobs.get(job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {job_id} not found")
        return job

    def CreateJob(self, request, context):
        self.calls.append(("CreateJob", request))
        ids, bad = [], []  # bad: (line number, custom_id, message)
        if request.WhichOneof("source") == "requests":
            numbered = [(n, r.custom_id) for n, r in enumerate(request.requests.requests, 1)]
        else:
            numbered = []
            for n, line in enumerate(request.jsonl.split(b"\n"), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    obj = e
                if not isinstance(obj, dict):
                    bad.append((n, None, "invalid JSON: not a JSON object"))
                    numbered.append((n, f"line-{n}"))
                    continue
                numbered.append((n, obj.get("custom_id", f"line-{n}")))
        for n, custom_id in numbered:
            ids.append(custom_id)
            if custom_id in self.line_errors:
                bad.append((n, custom_id, self.line_errors[custom_id]))
        if not ids:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "requests: the job has no requests")
        if bad:
            bad.sort()
            entries = [f"line {n}" + (f" (custom_id {json.dumps(c)})" if c else "") + f": {m}"
                       for n, c, m in bad]
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(bad)} of {len(ids)} {'line' if len(ids) == 1 else 'lines'} "
                          f"{'is' if len(bad) == 1 else 'are'} invalid: " + "; ".join(entries))
        if request.model not in ("", "tiny-mixtral"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"model: this daemon serves 'tiny-mixtral', not '{request.model}'")
        with self.lock:
            job_id = f"job_{self.next_id:04d}"
            self.next_id += 1
        job = self.add_job(job_id, total=len(ids))
        job.metadata.update(request.metadata)
        with self.lock:
            self.custom_ids[job_id] = ids
        return job

    def GetJob(self, request, context):
        self.calls.append(("GetJob", request))
        if request.job_id == "job_slow":
            time.sleep(2)
        return self._job(request.job_id, context)

    def ListJobs(self, request, context):
        self.calls.append(("ListJobs", request))
        with self.lock:
            jobs = sorted(self.jobs.values(), key=lambda j: (-j.created_at, j.id))
        if request.state != pb.JOB_STATE_UNSPECIFIED:
            jobs = [j for j in jobs if j.state == request.state]
        size = request.page_size or 20
        start = int(request.page_token or 0)
        page = jobs[start:start + size]
        token = str(start + size) if start + size < len(jobs) else ""
        return pb.ListJobsResponse(jobs=page, next_page_token=token)

    def CancelJob(self, request, context):
        self.calls.append(("CancelJob", request))
        job = self._job(request.job_id, context)
        with self.lock:
            if job.state not in (pb.JOB_STATE_COMPLETED, pb.JOB_STATE_FAILED):
                job.state = pb.JOB_STATE_CANCELLED
                job.finished_at = job.created_at + 5
        return job

    def WatchJob(self, request, context):
        self.calls.append(("WatchJob", request))
        job = self._job(request.job_id, context)
        total = job.request_counts.total
        if job.id == "job_flaky" and self.flaky_failures > 0:
            self.flaky_failures -= 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "daemon restarting")
        if job.id == "job_endless":
            context.add_callback(self.stream_cancelled.set)
            while context.is_active():
                yield pb.JobProgress(job_id=job.id, state=job.state,
                                     request_counts=job.request_counts)
                time.sleep(0.01)
            return
        if job.state in (pb.JOB_STATE_COMPLETED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED):
            yield pb.JobProgress(job_id=job.id, state=job.state, request_counts=job.request_counts,
                                 prompt_tokens=job.prompt_tokens,
                                 generated_tokens=job.generated_tokens, max_tokens_total=4 * total,
                                 tokens_per_second=job.tokens_per_second,
                                 elapsed_seconds=job.elapsed_seconds, error=job.error)
            return
        for done in range(total + 1):
            yield pb.JobProgress(
                job_id=job.id, state=pb.JOB_STATE_IN_PROGRESS,
                request_counts=pb.RequestCounts(total=total, completed=done),
                prompt_tokens=10 * total, generated_tokens=4 * done + 2 * (total - done),
                max_tokens_total=4 * total, tokens_per_second=100.0 * done,
                elapsed_seconds=0.5 * done, eta_seconds=float(total - done))
            if job.id == "job_broken":
                context.abort(grpc.StatusCode.INTERNAL, "boom")
        outcome = job.metadata.get("fake_outcome", "cancelled" if job.id == "job_doomed" else "")
        final = {"cancelled": pb.JOB_STATE_CANCELLED,
                 "failed": pb.JOB_STATE_FAILED}.get(outcome, pb.JOB_STATE_COMPLETED)
        with self.lock:
            job.state = final
            if final == pb.JOB_STATE_FAILED:
                job.error = "engine exploded"
            job.request_counts.completed = total
            job.started_at = job.created_at + 1
            job.finished_at = job.created_at + 10
            job.prompt_tokens, job.generated_tokens = 10 * total, 4 * total
            job.tokens_per_second, job.elapsed_seconds = 123.5, 4 * total / 123.5
        yield pb.JobProgress(job_id=job.id, state=final, request_counts=job.request_counts,
                             prompt_tokens=10 * total, generated_tokens=4 * total,
                             max_tokens_total=4 * total, tokens_per_second=123.5,
                             elapsed_seconds=job.elapsed_seconds, error=job.error)

    def GetResults(self, request, context):
        self.calls.append(("GetResults", request))
        job = self._job(request.job_id, context)
        ids = self.custom_ids[job.id]
        count = len(ids) if request.wait else min(2, len(ids))
        for index in range(count):
            yield pb.Result(index=index, custom_id=ids[index],
                            line=result_line(job.id, index, ids[index]))


def _health_handler(service):
    """grpc.health.v1.Health/Check in raw bytes, as moebatchd answers it: SERVING for
    moebatch.v1.BatchService unless service.loading_checks > 0 (then NOT_SERVING, counting down,
    as while the model loads)."""
    def check(request, context):
        if service.loading_checks > 0:
            service.loading_checks -= 1
            return b"\x08\x02"
        return b"\x08\x01"
    handler = grpc.unary_unary_rpc_method_handler(check)
    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": handler})


@pytest.fixture
def fake_server():
    """(address, FakeBatchService) of a fake daemon on a free loopback port."""
    service = FakeBatchService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_BatchServiceServicer_to_server(service, server)
    server.add_generic_rpc_handlers([_health_handler(service)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", service
    finally:
        server.stop(grace=None)


@pytest.fixture
def client(fake_server):
    from moebatch import Client

    address, _ = fake_server
    with Client(address, timeout=10) as c:
        yield c
