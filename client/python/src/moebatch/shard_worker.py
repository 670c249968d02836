"""The Ray actor of `moebatch shard` (moebatch.ray_driver): DaemonWorker, one per moebatchd daemon.
It submits the driver's shards to its daemon with moebatch.Client, adopts the daemon's existing job
for a shard instead of creating one (shard_plan.choose_job over the jobs' metadata), follows each
job and hands the finished shard's result lines back. Imports no Ray: ray_driver wraps the class
with ray.remote.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from .client import _CHANNEL_OPTIONS, Client
from .errors import ClientError
from .jobs import state_name
from .shard import error_line
from .shard_plan import UNUSABLE_STATES, JobInfo, choose_job, job_info, job_metadata
from .v1 import batch_pb2 as pb

# A daemon that comes back is reconnected within seconds (gRPC's default backoff grows to 2 min).
_WORKER_CHANNEL_OPTIONS = _CHANNEL_OPTIONS + [
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 3000),
]
# The call may have reached the daemon and stored the job even though it failed here.
_AMBIGUOUS = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                        grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED})
# The daemon did not answer: these count towards its being lost.
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# This driver may not use the daemon at all.
_EXCLUDING = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})



# -- the actor --------------------------------------------------------------------------------

class DaemonWorker:
    """The body of the Ray actor for one daemon at `server` ("host:port"). run() makes it a
    threaded actor: every method call runs on a thread of its own, and every method is
    thread-safe. It keeps no state the driver needs: a restarted actor lists the daemon's jobs
    again before it creates any.

    run: the run id (jobs of other runs are never touched). token, tls_*: as moebatch.Client
    (PEM bytes, as the files may not exist on the actor's node). timeout: seconds, the deadline of
    each unary call. poll_interval: seconds between GetJob calls while a job runs.
    """

    def __init__(self, server: str, run: str, token: str = "", tls_ca: bytes | None = None,
                 tls_cert: bytes | None = None, tls_key: bytes | None = None,
                 timeout: float = 30.0, poll_interval: float = 1.0):
        self.server = server
        self.run = run
        self.poll_interval = poll_interval
        self.client = Client(server, timeout=timeout, options=_WORKER_CHANNEL_OPTIONS,
                             token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
        self._lock = threading.Lock()
        self._index: dict[str, list[JobInfo]] | None = None  # shard -> this run's jobs there
        self._unusable: set[str] = set()       # job ids that ended badly for this run
        self._abandoned: set[str] = set()      # shards the driver took away
        self._live: dict[str, dict[str, Any]] = {}  # shard -> its job's figures, while it runs
        self._down_since: float | None = None  # monotonic time of the first failure in a row
        self._last_error = ""

    # -- reachability ----------------------------------------------------------------------

    def _answered(self) -> None:
        with self._lock:
            self._down_since = None

    def _failed(self, error: ClientError) -> None:
        if error.code in _UNREACHABLE:
            now = time.monotonic()
            if error.code == grpc.StatusCode.DEADLINE_EXCEEDED and self.client.timeout:
                now -= self.client.timeout  # silent since the call began
            with self._lock:
                if self._down_since is None:
                    self._down_since = now
                self._last_error = str(error)

    def _unary(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            value = fn(*args, **kwargs)
        except ClientError as e:
            self._failed(e)
            raise
        self._answered()
        return value

    # -- the daemon's jobs of this run -----------------------------------------------------

    def _list(self) -> dict[str, list[JobInfo]]:
        def collect() -> dict[str, list[JobInfo]]:
            found: dict[str, list[JobInfo]] = {}
            for job in self.client.list_jobs(page_size=1000):
                info = job_info(job, self.run)
                if info is not None:
                    found.setdefault(info.shard, []).append(info)
            return found

        found = self._unary(collect)
        with self._lock:
            self._index = found
        return found

    def _held(self) -> dict[str, list[str]]:
        """shard -> the sha256s of its usable jobs here."""
        with self._lock:
            index = self._index or {}
            return {shard: sorted({j.shard_sha256 for j in jobs
                                   if j.usable and j.id not in self._unusable})
                    for shard, jobs in index.items()
                    if any(j.usable and j.id not in self._unusable for j in jobs)}

    def probe(self) -> dict[str, Any]:
        """Lists the daemon's jobs of this run (ListJobs answers while the daemon loads its
        model). Returns {"ok": True, "held": {shard: [sha256, ...]}} or {"ok": False, "error":
        "CODE: message"}."""
        try:
            self._list()
        except ClientError as e:
            return {"ok": False, "error": str(e)}
        return {"ok": True, "held": self._held()}

    def status(self) -> dict[str, Any]:
        """Without a call to the daemon: {"down_for": seconds the daemon has failed every call
        (None: it answers), "error": the last failure, "live": {shard: {"jobs", "done", "failed",
        "total", "tokens"}} of the shards running here}."""
        with self._lock:
            down = None if self._down_since is None else time.monotonic() - self._down_since
            return {"down_for": down, "error": self._last_error,
                    "live": {s: dict(v) for s, v in self._live.items()}}

    def abandon(self, shards: Sequence[str]) -> None:
        """The driver moved these shards elsewhere: their run_shard calls return "abandoned"
        at their next step (within a poll interval, or the call deadline if a call hangs)."""
        with self._lock:
            self._abandoned.update(shards)

    def cancel(self, shard: str) -> list[str]:
        """Cancels this run's unfinished jobs for `shard` here (its results came from another
        daemon); best effort. Returns the ids cancelled."""
        with self._lock:
            jobs = list((self._index or {}).get(shard, []))
        cancelled = []
        for job in jobs:
            if not job.usable or job.state == pb.JOB_STATE_COMPLETED:
                continue
            try:
                self._unary(self.client.cancel, job.id)
            except ClientError:
                continue
            with self._lock:
                self._unusable.add(job.id)
            cancelled.append(job.id)
        return cancelled

    # -- one shard -------------------------------------------------------------------------

    def _is_abandoned(self, shard: str) -> bool:
        with self._lock:
            return shard in self._abandoned

    def _pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def _adoptable(self, shard: str, sha256: str, part_sha256: str) -> JobInfo | None:
        with self._lock:
            return choose_job((self._index or {}).get(shard, []), sha256, self._unusable,
                              part_sha256)

    def _remember(self, job: pb.Job) -> None:
        info = job_info(job, self.run)
        if info is None:
            return
        with self._lock:
            if self._index is None:
                self._index = {}
            jobs = [j for j in self._index.get(info.shard, []) if j.id != info.id]
            self._index[info.shard] = jobs + [info]

    def _forget(self, shard: str, job_id: str) -> None:
        with self._lock:
            if self._index is not None and shard in self._index:
                self._index[shard] = [j for j in self._index[shard] if j.id != job_id]

    def _download(self, job_id: str) -> list[str]:
        def collect() -> list[str]:
            return [r.line.rstrip("\n") for r in self.client.result_messages(job_id, wait=False)]

        return self._unary(collect)

    def _place(self, shard: str, sha256: str, data: bytes) -> list[tuple] | dict[str, Any]:
        """Adopts or creates the jobs that run the shard: one job for the whole shard; when the
        daemon refuses it (INVALID_ARGUMENT: a bad line, more requests than one job may have),
        each half in turn, down to single lines, which are then refused alone. Returns the
        pieces in the shard's order, ("job", job_id, adopted) or ("refused", custom_id,
        message), or an outcome (see run_shard) when the shard cannot go on here."""
        pieces: list[tuple] = []
        todo = [data.splitlines(keepends=True)]
        delay = self.poll_interval
        while todo:
            lines = todo.pop(0)
            part = b"".join(lines)
            part_sha = "" if part == data else hashlib.sha256(part).hexdigest()
            while True:
                if self._is_abandoned(shard):
                    return {"status": "abandoned"}
                if self._index is None:
                    try:
                        self._list()
                    except ClientError:
                        self._pause(delay)
                        delay = min(delay * 2, 10.0)
                        continue
                chosen = self._adoptable(shard, sha256, part_sha)
                if chosen is not None:
                    pieces.append(("job", chosen.id, True))
                    break
                try:
                    job = self.client.create_job(
                        jsonl=part, metadata=job_metadata(self.run, shard, sha256, part_sha))
                except ClientError as e:
                    if e.code in _AMBIGUOUS:
                        # The job may be stored: list again before another CreateJob.
                        with self._lock:
                            self._index = None
                        self._pause(delay)
                        delay = min(delay * 2, 10.0)
                        continue
                    if e.code == grpc.StatusCode.INVALID_ARGUMENT:
                        if len(lines) == 1:
                            custom_id = json.loads(lines[0])["custom_id"]
                            pieces.append(("refused", custom_id, e.message))
                        else:
                            half = len(lines) // 2
                            todo[0:0] = [lines[:half], lines[half:]]
                        break
                    if e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        return {"status": "busy", "message": str(e)}
                    if e.code in _EXCLUDING:
                        return {"status": "excluded", "message": str(e)}
                    return {"status": "refused", "message": str(e)}
                self._answered()
                self._remember(job)
                pieces.append(("job", job.id, False))
                break
        return pieces

    def _follow(self, shard: str, pieces: list[tuple]) -> dict[str, Any] | None:
        """Follows the pieces' jobs with GetJob every poll_interval until every one completed,
        then downloads their result lines. Returns the outcome (see run_shard), or None when a
        job is gone (deleted): place the shard again."""
        job_ids = [p[1] for p in pieces if p[0] == "job"]
        jobs: dict[str, pb.Job] = {}
        delay = self.poll_interval
        while True:
            if self._is_abandoned(shard):
                return {"status": "abandoned"}
            try:
                for job_id in job_ids:
                    if job_id not in jobs or jobs[job_id].state != pb.JOB_STATE_COMPLETED:
                        jobs[job_id] = self._unary(self.client.get_job, job_id)
                        self._remember(jobs[job_id])
            except ClientError as e:
                if e.code == grpc.StatusCode.NOT_FOUND:
                    self._forget(shard, job_id)
                    return None
                if e.code in _EXCLUDING:
                    return {"status": "excluded", "message": str(e)}
                self._pause(delay)
                delay = min(delay * 2, 10.0)
                continue
            delay = self.poll_interval
            counts = [jobs[j].request_counts for j in job_ids]
            refused = sum(1 for p in pieces if p[0] == "refused")
            with self._lock:
                self._live[shard] = {
                    "jobs": job_ids, "total": sum(c.total for c in counts) + refused,
                    "done": sum(c.completed + c.failed + c.cancelled for c in counts) + refused,
                    "failed": sum(c.failed for c in counts) + refused,
                    "tokens": sum(jobs[j].generated_tokens for j in job_ids)}
            for job_id in job_ids:
                if jobs[job_id].state in UNUSABLE_STATES:
                    with self._lock:
                        self._unusable.add(job_id)
                    job = jobs[job_id]
                    return {"status": "ended", "job": job_id, "state": state_name(job.state),
                            "message": job.error or state_name(job.state)}
            if all(jobs[j].state == pb.JOB_STATE_COMPLETED for j in job_ids):
                break
            self._pause(self.poll_interval)
        lines: list[str] = []
        for piece in pieces:
            if piece[0] == "refused":
                lines.append(json.dumps(error_line(piece[1], "invalid_request",
                                                   f"{self.server} refused the request: "
                                                   f"{piece[2]}"), ensure_ascii=False))
                continue
            job = jobs[piece[1]]
            while True:
                if self._is_abandoned(shard):
                    return {"status": "abandoned"}
                try:
                    got = self._download(job.id)
                except ClientError as e:
                    if e.code == grpc.StatusCode.NOT_FOUND:
                        self._forget(shard, job.id)
                        return None
                    self._pause(self.poll_interval)
                    continue
                if len(got) == job.request_counts.total:
                    break
                self._pause(self.poll_interval)  # not every line yet: fetch again
            lines.extend(got)
        return {"status": "done", "jobs": job_ids,
                "adopted": any(p[0] == "job" and p[2] for p in pieces),
                "lines": ("\n".join(lines) + "\n").encode("utf-8"),
                "requests": len(lines),
                "failed": sum(jobs[j].request_counts.failed + jobs[j].request_counts.cancelled
                              for j in job_ids) + sum(1 for p in pieces if p[0] == "refused"),
                "tokens": sum(jobs[j].generated_tokens for j in job_ids)}

    def run_shard(self, shard: str, sha256: str, data: bytes) -> dict[str, Any]:
        """Runs one shard on this daemon to its end: adopts this run's usable job for it (see
        shard_plan.choose_job) or creates one with `data` (the shard file's bytes; in halves
        when the daemon refuses the whole, see _place), follows the jobs with GetJob every
        poll_interval, and downloads their result lines once they completed. Retries on its own
        while the daemon is unreachable, until the driver abandons the shard.

        Returns {"status": ...} with
          "done": "jobs" (ids), "adopted" (bool: a job existed before), "lines" (bytes, one
                  result or error line per request, in the shard's order), "requests",
                  "failed", "tokens" (generated);
          "ended": a job failed, was cancelled or expired ("job", "state", "message");
          "busy": CreateJob answered RESOURCE_EXHAUSTED ("message");
          "refused": CreateJob refused the shard for another reason ("message");
          "excluded": the daemon refuses this driver (UNAUTHENTICATED, PERMISSION_DENIED);
          "abandoned": the driver took the shard away.
        """
        with self._lock:
            self._abandoned.discard(shard)
        try:
            while True:
                pieces = self._place(shard, sha256, data)
                if isinstance(pieces, dict):
                    return pieces
                outcome = self._follow(shard, pieces)
                if outcome is not None:
                    return outcome
        finally:
            with self._lock:
                self._live.pop(shard, None)
