"""Client: the moebatch.v1.BatchService API of moebatchd, over a plaintext or TLS gRPC channel.

    from moebatch import Client, chat_request

    with Client("127.0.0.1:50051") as client:
        job = client.create_job(requests=[chat_request("q-1", "Hello", max_tokens=16)])
        for progress in client.watch(job.id):
            print(progress.request_counts.completed, "/", progress.request_counts.total)
        for line in client.results(job.id):
            print(line["custom_id"], line["response"]["body"]["choices"][0]["message"]["content"])

Authentication: `token` (default $MOEBATCH_TOKEN) is sent with every call as the metadata
`authorization: Bearer <token>`; the daemon needs one when it has a tokens file. TLS: give
`tls_ca` (the PEM file that signed the daemon's certificate; `tls=True` alone uses the system's
roots), and `tls_cert` / `tls_key` for a client certificate (mutual TLS); each is a file's path or
its PEM bytes.

Unary calls (create_job, get_job, list_jobs' pages, cancel) run under the client's `timeout`
(seconds; None = no deadline). Streams (watch, results) have no deadline: a job may run for hours.
Every gRPC failure is raised as moebatch.ClientError (code and message); streams raise it when
iterated. Stopping iteration early cancels the stream.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc

from .batch_requests import to_jsonl
from .errors import ClientError
from .jobs import TERMINAL_STATES, parse_state
from .v1 import batch_pb2 as pb
from .v1 import batch_pb2_grpc as pb_grpc

DEFAULT_SERVER = "127.0.0.1:50051"
DEFAULT_TIMEOUT = 60.0
# Results and jobs are small, but allow large messages rather than fail on a big job's page.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", -1),
]


def default_server() -> str:
    """$MOEBATCH_SERVER, or 127.0.0.1:50051."""
    return os.environ.get("MOEBATCH_SERVER") or DEFAULT_SERVER


def default_token() -> str | None:
    """$MOEBATCH_TOKEN, or None."""
    return os.environ.get("MOEBATCH_TOKEN") or None


def _read_pem(what: str, path: str | os.PathLike | bytes | None) -> bytes | None:
    """The PEM bytes of a file, or `path` itself when it is bytes already."""
    if path is None or isinstance(path, bytes):
        return path
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e.strerror}") from None


def _jsonl_field(data: str | bytes) -> bytes:
    """The payload for CreateJobRequest.jsonl (a proto `bytes` field): sent as is, so the daemon
    judges the encoding and names the line of any text that is not UTF-8."""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


class Client:
    """A connection to moebatchd at `addr` ("host:port"; default $MOEBATCH_SERVER or
    127.0.0.1:50051). Close it with close() or use it as a context manager."""

    def __init__(self, addr: str | None = None, timeout: float | None = DEFAULT_TIMEOUT, *,
                 channel: grpc.Channel | None = None,
                 options: Iterable[tuple[str, Any]] | None = None,
                 token: str | None = None, tls: bool = False,
                 tls_ca: str | os.PathLike | bytes | None = None,
                 tls_cert: str | os.PathLike | bytes | None = None,
                 tls_key: str | os.PathLike | bytes | None = None,
                 tls_server_name: str | None = None):
        self.addr = addr or default_server()
        self.timeout = timeout
        token = token if token is not None else default_token()
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        channel_options = list(options) if options is not None else list(_CHANNEL_OPTIONS)
        self._own_channel = channel is None
        if channel is not None:
            self._channel = channel
        elif tls or tls_ca is not None or tls_cert is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_pem("tls_ca", tls_ca),
                private_key=_read_pem("tls_key", tls_key),
                certificate_chain=_read_pem("tls_cert", tls_cert))
            if tls_server_name:
                channel_options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(self.addr, credentials, options=channel_options)
        else:
            self._channel = grpc.insecure_channel(self.addr, options=channel_options)
        self._service = pb_grpc.BatchServiceStub(self._channel)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the daemon serves jobs: it answers and its grpc.health.v1 status for
        moebatch.v1.BatchService is SERVING (it is NOT_SERVING while the model loads). Raises
        ClientError UNAVAILABLE if that has not happened within `timeout` seconds."""
        # grpc.health.v1.Health/Check by hand (no extra package): HealthCheckRequest{service} is
        # field 1, a string; HealthCheckResponse{status} is field 1, an enum (1 = SERVING).
        service = b"moebatch.v1.BatchService"
        check = self._channel.unary_unary("/grpc.health.v1.Health/Check")
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientError(grpc.StatusCode.UNAVAILABLE,
                                  f"moebatchd at {self.addr} not serving within {timeout:g}s "
                                  f"({last})")
            try:
                response = check(b"\x0a" + bytes([len(service)]) + service,
                                 timeout=min(left, 2.0), wait_for_ready=True)
                if response[:2] == b"\x08\x01":
                    return
                last = "loading its model"
            except grpc.RpcError as e:
                last = e.code().name if hasattr(e, "code") else str(e)
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))

    # -- calls ------------------------------------------------------------------------------

    def _unary(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise ClientError.from_rpc_error(e) from e

    def _stream(self, method: Callable[..., Any], request: Any) -> Iterator[Any]:
        call = method(request, metadata=self._metadata)
        try:
            for message in call:
                yield message
        except grpc.RpcError as e:
            raise ClientError.from_rpc_error(e) from e
        finally:
            call.cancel()  # a no-op once the stream has ended; stops it if the caller broke off

    def create_job(self, requests: Iterable[Mapping[str, Any] | pb.BatchRequest] | None = None,
                   jsonl: str | bytes | None = None, path: str | os.PathLike | None = None,
                   metadata: Mapping[str, str] | None = None, model: str = "") -> pb.Job:
        """Submits a job; give exactly one of:

        requests: OpenAI-style dicts (batch input lines or bodies with a custom_id, see
            moebatch.build_request) or BatchRequest messages. With any dict they are sent as a
            JSONL payload, one line per item in order (the daemon's "line N" is requests[N-1]);
            only BatchRequest messages go as inline requests. Neither is checked here beyond
            its shape: the daemon validates them.
        jsonl: an OpenAI batch input file's text, sent verbatim (the daemon validates it).
        path: the path of such a file.

        A job with bad requests is refused as a whole: ClientError INVALID_ARGUMENT, the message
        listing every bad line ("2 of 3 lines are invalid: line 2 (custom_id "b"): body.top_p:
        must be in (0, 1], got 5; ...", docs/api.md).

        metadata: free-form string pairs kept with the job. model: empty or the daemon's model.
        Returns the accepted Job (stored durably before the daemon answers).
        """
        if sum(x is not None for x in (requests, jsonl, path)) != 1:
            raise ValueError("create_job: give exactly one of requests, jsonl or path")
        meta = dict(metadata or {})
        for key, value in meta.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"metadata: keys and values must be strings, got {key!r}: "
                                 f"{value!r}")
        if not isinstance(model, str):
            raise ValueError(f"model: must be a string, got {model!r}")
        request = pb.CreateJobRequest(metadata=meta, model=model)
        if requests is not None:
            if isinstance(requests, (str, bytes, Mapping)):
                raise ValueError("requests: must be a list of dicts or BatchRequest messages")
            items = list(requests)
            if items and all(isinstance(r, pb.BatchRequest) for r in items):
                request.requests.requests.extend(items)
            else:
                request.jsonl = to_jsonl(items)
        elif jsonl is not None:
            if not isinstance(jsonl, (str, bytes, bytearray)):
                raise ValueError(f"jsonl: must be str or bytes, got {type(jsonl).__name__}")
            request.jsonl = _jsonl_field(jsonl)
        else:
            request.jsonl = _jsonl_field(Path(path).read_bytes())
        return self._unary(self._service.CreateJob, request)

    def get_job(self, job_id: str) -> pb.Job:
        return self._unary(self._service.GetJob, pb.GetJobRequest(job_id=job_id))

    def list_jobs_page(self, state: int | str | None = None, page_size: int = 100,
                       page_token: str = "", tenant: str = "") -> pb.ListJobsResponse:
        """One page of jobs, newest first (see list_jobs for iterating all of them)."""
        return self._unary(self._service.ListJobs, pb.ListJobsRequest(
            page_size=page_size, page_token=page_token, tenant=tenant,
            state=pb.JOB_STATE_UNSPECIFIED if state is None else parse_state(state)))

    def list_jobs(self, state: int | str | None = None, page_size: int = 100,
                  limit: int | None = None, tenant: str = "") -> Iterator[pb.Job]:
        """Jobs newest first, optionally only those in `state` ("completed", a JobState, ...),
        fetching pages of `page_size` as iteration goes on; at most `limit` jobs if given.
        The caller's own jobs; an admin token sees every tenant's, or `tenant`'s only."""
        if page_size < 1:
            raise ValueError(f"page_size: must be >= 1, got {page_size}")
        state_value = None if state is None else parse_state(state)  # fail before iterating
        return self._list_jobs(state_value, page_size, limit, tenant)

    def _list_jobs(self, state: int | None, page_size: int, limit: int | None, tenant: str
                   ) -> Iterator[pb.Job]:
        token, count = "", 0
        while True:
            page = self.list_jobs_page(state, page_size, token, tenant)
            for job in page.jobs:
                if limit is not None and count >= limit:
                    return
                count += 1
                yield job
            if not page.next_page_token or page.next_page_token == token:
                return
            token = page.next_page_token

    def cancel(self, job_id: str) -> pb.Job:
        """Cancels the job (a no-op on a finished one); returns it, typically CANCELLING."""
        return self._unary(self._service.CancelJob, pb.CancelJobRequest(job_id=job_id))

    def delete_job(self, job_id: str) -> None:
        """Deletes a finished job with its requests and results (FAILED_PRECONDITION while it
        runs: cancel it first)."""
        self._unary(self._service.DeleteJob, pb.DeleteJobRequest(job_id=job_id))

    def watch(self, job_id: str) -> Iterator[pb.JobProgress]:
        """JobProgress now and at every change until the job is terminal (the last one says
        which terminal state)."""
        return self._stream(self._service.WatchJob, pb.WatchJobRequest(job_id=job_id))

    def result_messages(self, job_id: str, wait: bool = True) -> Iterator[pb.Result]:
        """The Result messages (index, custom_id, line) in input order. With wait, follows the
        job until every request has a result; without, the ones committed so far."""
        return self._stream(self._service.GetResults,
                            pb.GetResultsRequest(job_id=job_id, wait=wait))

    def results(self, job_id: str, wait: bool = True) -> Iterator[dict[str, Any]]:
        """The OpenAI batch output lines, parsed, in input order (see result_messages)."""
        for result in self.result_messages(job_id, wait=wait):
            yield json.loads(result.line)

    def wait(self, job_id: str,
             on_progress: Callable[[pb.JobProgress], None] | None = None,
             reconnect_timeout: float = 60.0) -> tuple[pb.Job, pb.JobProgress | None]:
        """Watches the job until it is terminal, calling on_progress for each message; returns
        the final Job and the last JobProgress. If the daemon goes away (UNAVAILABLE, or the
        stream ends early), it reconnects for up to `reconnect_timeout` seconds, so a wait
        survives a daemon restart."""
        last: pb.JobProgress | None = None
        deadline: float | None = None
        delay = 0.2
        while True:
            try:
                for progress in self.watch(job_id):
                    deadline, delay = None, 0.2
                    last = progress
                    if on_progress is not None:
                        on_progress(progress)
                job = self.get_job(job_id)
                if job.state in TERMINAL_STATES:
                    return job, last
                failure = ClientError(grpc.StatusCode.UNAVAILABLE,
                                      f"the progress stream of {job_id} ended early")
            except ClientError as e:
                if e.code != grpc.StatusCode.UNAVAILABLE:
                    raise
                failure = e
            now = time.monotonic()
            if deadline is None:
                deadline = now + reconnect_timeout
            if now >= deadline:
                raise failure
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
