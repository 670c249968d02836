"""The multi-daemon driver's bookkeeping, without Ray and without the network: the run id and the
job metadata that tag a shard's job, which of a daemon's jobs a shard adopts, the run's state file,
the Planner that decides which shard goes to which daemon (and back to the queue when a daemon is
lost), and RunProgress (done/total, tokens/s, ETA, per daemon). moebatch.ray_driver drives these
from the actors' reports; they are unit-tested alone (client/python/tests/test_shard_plan.py).

Exactly once, in the words of this module: every job the driver creates carries the metadata
RUN_KEY (the run id: sha256 of the input's sha256 and the output's absolute path), SHARD_KEY (the
shard's name) and SHARD_SHA_KEY (the shard file's sha256), and PART_KEY (the sha256 of the lines
sent) when it holds only part of the shard (a daemon refused the whole: it is run in halves).
Before a daemon gets a new job for a shard, its jobs are listed and a job with the same values is
adopted instead (choose_job), so neither a daemon that restarted nor a driver that was rerun
submits a shard twice to one daemon. A shard moves to another daemon only when its daemon is lost
(Planner.lose); both may then run it, and the first result file written wins (the merge keeps
every custom_id once).
"""
from __future__ import annotations

import bisect
import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .cli import format_duration
from .shard import atomic_write
from .v1 import batch_pb2 as pb

RUN_KEY = "moebatch.run"
SHARD_KEY = "moebatch.shard"
SHARD_SHA_KEY = "moebatch.shard_sha256"
PART_KEY = "moebatch.part_sha256"
STATE_FILE = "state.json"

#: Job states whose job never gives a shard its results: a new job replaces it.
UNUSABLE_STATES = frozenset({pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLING,
                             pb.JOB_STATE_CANCELLED, pb.JOB_STATE_EXPIRED})


def run_id(source_sha256: str, output: str | os.PathLike) -> str:
    """The run's id: the first 24 hex digits of sha256("<input sha256>\\n<absolute output
    path>"). The same input written to the same output is the same run."""
    text = f"{source_sha256}\n{os.path.abspath(output)}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def job_metadata(run: str, shard: str, shard_sha256: str, part_sha256: str = ""
                 ) -> dict[str, str]:
    """The metadata a shard's job is created with; part_sha256: the sha256 of the lines sent
    when they are only part of the shard ("": the whole shard)."""
    meta = {RUN_KEY: run, SHARD_KEY: shard, SHARD_SHA_KEY: shard_sha256}
    if part_sha256:
        meta[PART_KEY] = part_sha256
    return meta


@dataclass(frozen=True)
class JobInfo:
    """A daemon's job of this run: what adoption needs to know of it."""
    id: str
    shard: str
    shard_sha256: str
    state: int           # a JobState
    created_at: int      # Unix seconds
    part_sha256: str = ""  # the lines it holds when only part of the shard

    @property
    def usable(self) -> bool:
        return self.state not in UNUSABLE_STATES


def job_info(job: pb.Job, run: str) -> JobInfo | None:
    """The JobInfo of a job of run `run`, None for any other job."""
    meta = job.metadata
    if meta.get(RUN_KEY) != run or not meta.get(SHARD_KEY):
        return None
    return JobInfo(id=job.id, shard=meta[SHARD_KEY], shard_sha256=meta.get(SHARD_SHA_KEY, ""),
                   state=job.state, created_at=job.created_at,
                   part_sha256=meta.get(PART_KEY, ""))


def choose_job(jobs: Iterable[JobInfo], shard_sha256: str,
               unusable: frozenset[str] | set[str] = frozenset(),
               part_sha256: str = "") -> JobInfo | None:
    """The job a shard (or the part of it with part_sha256) adopts among one daemon's jobs for
    it: same shard sha256 and part, not failed, cancelled or expired, not in `unusable` (ids that
    ended badly for this driver); a completed one first, then the newest. None: create one."""
    candidates = [j for j in jobs
                  if j.shard_sha256 == shard_sha256 and j.part_sha256 == part_sha256
                  and j.usable and j.id not in unusable]
    if not candidates:
        return None
    return max(candidates, key=lambda j: (j.state == pb.JOB_STATE_COMPLETED, j.created_at, j.id))


# -- the state file ---------------------------------------------------------------------------

@dataclass
class RunState:
    """work_dir/state.json: the run's record, for people and for the next driver. What is done is
    not taken from it but from the result files (results/<shard>.jsonl, each written atomically);
    which daemon holds which shard's job is learnt again by listing the daemons. It holds the run
    id (a rerun for another output is refused) and the last known place of each shard."""
    run_id: str
    source: str
    source_sha256: str
    output: str
    errors: str
    servers: list[str] = field(default_factory=list)
    sessions: int = 0                 # driver starts on this work dir
    created_at: float = 0.0           # Unix seconds
    updated_at: float = 0.0
    finished: bool = False            # merged into the output
    # shard name -> {"server": addr, "job": id or "", "state": "running" | "done" | "failed",
    # "message": why it failed (failed only)}
    shards: dict[str, dict[str, str]] = field(default_factory=dict)
    # server -> Unix time it was declared lost, while it is lost (it leaves when it answers again)
    lost: dict[str, float] = field(default_factory=dict)

    def save(self, work_dir: str | os.PathLike) -> None:
        """Writes work_dir/state.json atomically (fsync, rename)."""
        self.updated_at = time.time()
        atomic_write(Path(work_dir) / STATE_FILE,
                     json.dumps(asdict(self), indent=1, sort_keys=True).encode())

    @staticmethod
    def load(work_dir: str | os.PathLike) -> "RunState | None":
        """The state in work_dir, None when there is none. Raises ValueError when the file is not
        a state file (TypeError from an unknown field is raised as ValueError too)."""
        path = Path(work_dir) / STATE_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            return RunState(**json.loads(text))
        except TypeError as e:
            raise ValueError(f"{path}: not a moebatch state file: {e}") from None


# -- the planner ------------------------------------------------------------------------------

class Planner:
    """Which shard runs where. Single-threaded (the driver's loop). Shards are named; their order
    (the input's) decides which pending shard goes first.

    A shard is pending, running on one daemon, done, or failed. `holders` are the daemons that
    have (or may have: a job was asked for) a usable job for a shard. assign() fills every daemon
    that is not lost up to its cap: first with pending shards it holds a job for (they adopt it),
    then with the first pending shards no other usable daemon holds. A lost daemon's running
    shards go back to pending (lose); when it answers again (revive) it is used again, and its
    jobs for shards already done are named for cancelling.
    """

    def __init__(self, shards: list[str], servers: list[str], in_flight: int,
                 max_attempts: int = 3, done: Iterable[str] = ()):
        if not servers:
            raise ValueError("servers: at least one daemon")
        if len(set(servers)) != len(servers):
            raise ValueError("servers: a daemon is named twice")
        if in_flight < 1 or max_attempts < 1:
            raise ValueError("in_flight and max_attempts must be at least 1")
        self.servers = list(servers)
        self.order = {name: i for i, name in enumerate(shards)}
        self.names = list(shards)
        self.max_attempts = max_attempts
        self.done: set[str] = set(done) & set(shards)
        self.failed: dict[str, str] = {}
        self._pending: list[int] = [i for i, s in enumerate(shards) if s not in self.done]
        self._pending_members: set[int] = set(self._pending)
        self.running: dict[str, str] = {}                 # shard -> server
        self.in_flight: dict[str, set[str]] = {s: set() for s in servers}
        self.cap: dict[str, int] = {s: in_flight for s in servers}
        self.holders: dict[str, set[str]] = {}            # shard -> servers
        self.held: dict[str, set[str]] = {s: set() for s in servers}  # server -> shards
        self.lost: set[str] = set()
        self.excluded: dict[str, str] = {}                # server -> why it is not used
        self.attempts: dict[str, int] = {}                # jobs of a shard that ended badly
        self.moved = 0                                    # shards taken off a lost daemon

    # -- queries ---------------------------------------------------------------------------

    @property
    def pending(self) -> list[str]:
        return [self.names[i] for i in self._pending]

    @property
    def complete(self) -> bool:
        """Every shard is done or failed."""
        return len(self.done) + len(self.failed) == len(self.names)

    def usable(self, server: str) -> bool:
        return server not in self.lost and server not in self.excluded

    @property
    def usable_servers(self) -> list[str]:
        return [s for s in self.servers if self.usable(s)]

    # -- bookkeeping -----------------------------------------------------------------------

    def _push(self, shard: str) -> None:
        i = self.order[shard]
        at = bisect.bisect_left(self._pending, i)
        if i not in self._pending_members:
            self._pending.insert(at, i)
            self._pending_members.add(i)

    def _pop(self, shard: str) -> None:
        i = self.order[shard]
        at = bisect.bisect_left(self._pending, i)
        if i in self._pending_members:
            del self._pending[at]
            self._pending_members.discard(i)

    def _hold(self, shard: str, server: str) -> None:
        self.holders.setdefault(shard, set()).add(server)
        self.held[server].add(shard)

    def _unhold(self, shard: str, server: str) -> None:
        self.holders.get(shard, set()).discard(server)
        self.held[server].discard(shard)

    def _stop_running(self, shard: str) -> str | None:
        server = self.running.pop(shard, None)
        if server is not None:
            self.in_flight[server].discard(shard)
        return server

    def note_jobs(self, server: str, shards: Iterable[str]) -> None:
        """`server` has usable jobs for these shards (from listing its jobs)."""
        for shard in shards:
            if shard in self.order and shard not in self.done:
                self._hold(shard, server)

    # -- decisions -------------------------------------------------------------------------

    def _next_for(self, server: str) -> str | None:
        held = [self.order[s] for s in self.held[server] if self.order[s] in self._pending_members]
        if held:
            return self.names[min(held)]
        for i in self._pending:
            shard = self.names[i]
            if not any(self.usable(h) and h != server for h in self.holders.get(shard, ())):
                return shard
        return None

    def assign(self) -> list[tuple[str, str]]:
        """(server, shard) pairs to start now, round-robin over the usable daemons with a free
        slot, until no daemon or no shard is left. Each pair is running from here on."""
        out: list[tuple[str, str]] = []
        progress = True
        while progress and self._pending:
            progress = False
            for server in self.servers:
                if not self.usable(server) or len(self.in_flight[server]) >= self.cap[server]:
                    continue
                shard = self._next_for(server)
                if shard is None:
                    continue
                self._pop(shard)
                self.running[shard] = server
                self.in_flight[server].add(shard)
                self._hold(shard, server)
                out.append((server, shard))
                progress = True
        return out

    def finish(self, shard: str, server: str) -> list[str]:
        """The shard's results are written (from `server`'s job). Returns the other daemons that
        hold a job for it, whose jobs are now surplus (cancel them). A shard already done or
        failed is left as it is (and nothing is returned)."""
        if shard in self.done:
            return []
        self._stop_running(shard)
        self._pop(shard)
        self.failed.pop(shard, None)
        self.done.add(shard)
        others = sorted(self.holders.pop(shard, set()) - {server})
        for s in self.servers:
            self.held[s].discard(shard)
        return others

    def requeue(self, shard: str) -> None:
        """The shard's run stopped without an outcome (its actor died, or the daemon was busy):
        pending again, its holders kept (the same daemon adopts its job)."""
        if self._stop_running(shard) is not None and shard not in self.done:
            self._push(shard)

    def job_ended(self, shard: str, server: str, why: str) -> bool:
        """The shard's job on `server` failed, was cancelled or expired. The shard is pending
        again, for any daemon, unless it has had max_attempts such jobs: then it fails with
        `why`. Returns True when it failed."""
        self._stop_running(shard)
        self._unhold(shard, server)
        if shard in self.done:
            return False
        self.attempts[shard] = self.attempts.get(shard, 0) + 1
        if self.attempts[shard] >= self.max_attempts:
            self.fail(shard, f"{self.attempts[shard]} jobs ended badly, the last on {server}: "
                             f"{why}")
            return True
        self._push(shard)
        return False

    def fail(self, shard: str, why: str) -> None:
        """The shard cannot run (a daemon refused it, or too many of its jobs ended badly): its
        requests go to the errors file with `why`."""
        self._stop_running(shard)
        self._pop(shard)
        if shard not in self.done:
            self.failed[shard] = why

    def busy(self, server: str, shard: str, why: str) -> bool:
        """`server` refused the shard for a limit (RESOURCE_EXHAUSTED). With other shards in
        flight there, its cap drops to their number and the shard is pending again; alone, it
        counts as a job that ended badly (see job_ended). Returns True when the shard failed."""
        self._stop_running(shard)
        others = len(self.in_flight[server])
        if others > 0:
            self.cap[server] = others
            self._unhold(shard, server)
            if shard not in self.done:
                self._push(shard)
            return False
        return self.job_ended(shard, server, why)

    def lose(self, server: str) -> list[str]:
        """`server` is lost: its running shards are pending again (it keeps holding their jobs:
        if it comes back before another daemon takes one, it adopts it). Returns those shards."""
        if server in self.lost:
            return []
        self.lost.add(server)
        moved = sorted(self.in_flight[server], key=self.order.__getitem__)
        for shard in moved:
            self._stop_running(shard)
            self._push(shard)
        self.moved += len(moved)
        return moved

    def revive(self, server: str, shards: Iterable[str]) -> list[str]:
        """`server` answers again; `shards`: those it has usable jobs for now. Returns those of
        them already done (surplus jobs: cancel them)."""
        self.lost.discard(server)
        for shard in list(self.held[server]):
            self._unhold(shard, server)
        surplus = []
        for shard in shards:
            if shard in self.done:
                surplus.append(shard)
            elif shard in self.order:
                self._hold(shard, server)
        return sorted(surplus, key=lambda s: self.order.get(s, -1))

    def exclude(self, server: str, why: str) -> list[str]:
        """`server` refuses this driver for good (UNAUTHENTICATED, PERMISSION_DENIED): it is no
        longer used; its running shards are pending again (returned)."""
        self.excluded[server] = why
        moved = sorted(self.in_flight[server], key=self.order.__getitem__)
        for shard in moved:
            self._stop_running(shard)
            self._unhold(shard, server)
            self._push(shard)
        for shard in list(self.held[server]):
            self._unhold(shard, server)
        return moved


# -- progress ---------------------------------------------------------------------------------

@dataclass
class ServerFigures:
    """One daemon's share of the run as the driver sees it now."""
    requests: int = 0          # requests with a result: shards written plus jobs running now
    failed: int = 0            # of those, failed requests
    tokens: int = 0            # generated tokens of those requests (this driver session)
    in_flight: int = 0         # shards running there
    status: str = "ok"         # "ok", "unreachable 12s", "lost", "excluded: ..."


class RunProgress:
    """Done/total requests, tokens/s, ETA for the whole run and per daemon. update() takes each
    daemon's figures (cumulative for this driver session; they may drop when a lost daemon's
    running shards are taken away) plus `base_requests`: requests of shards done before this
    session. Rates are over the last `window` seconds (or since the start, if shorter); the ETA
    is the requests left over the request rate. Single-threaded; times are time.monotonic()
    seconds unless `now` is given."""

    def __init__(self, total_requests: int, window: float = 60.0):
        self.total = total_requests
        self.window = window
        self.start: float | None = None
        self.servers: dict[str, ServerFigures] = {}
        self.base_requests = 0
        self.base_failed = 0
        self._samples: deque[tuple[float, int, int, dict[str, int]]] = deque()

    def update(self, servers: Mapping[str, ServerFigures], base_requests: int = 0,
               base_failed: int = 0, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.start is None:
            self.start = now
        self.servers = dict(servers)
        self.base_requests, self.base_failed = base_requests, base_failed
        self._samples.append((now, self.done, self.tokens,
                              {s: f.tokens for s, f in self.servers.items()}))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window:
            self._samples.popleft()

    @property
    def done(self) -> int:
        return min(self.total, self.base_requests + sum(f.requests for f in self.servers.values()))

    @property
    def failed(self) -> int:
        return self.base_failed + sum(f.failed for f in self.servers.values())

    @property
    def tokens(self) -> int:
        return sum(f.tokens for f in self.servers.values())

    def _span(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        return self._samples[-1][0] - self._samples[0][0]

    def tokens_per_second(self, server: str | None = None) -> float:
        span = self._span()
        if span <= 0:
            return 0.0
        first, last = self._samples[0], self._samples[-1]
        if server is None:
            delta = last[2] - first[2]
        else:
            delta = last[3].get(server, 0) - first[3].get(server, 0)
        return max(0.0, delta / span)

    def requests_per_second(self) -> float:
        span = self._span()
        if span <= 0:
            return 0.0
        return max(0.0, (self._samples[-1][1] - self._samples[0][1]) / span)

    def eta_seconds(self) -> float | None:
        """Seconds left at the current request rate; 0 when done, None when unknown."""
        left = self.total - self.done
        if left <= 0:
            return 0.0
        rate = self.requests_per_second()
        return left / rate if rate > 0 else None

    def elapsed(self, now: float | None = None) -> float:
        if self.start is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.start

    def describe(self) -> str:
        """"1234/3000 requests (41%), 12 failed, 512.3 tok/s, ETA 0:42, 3 daemons (1 lost)"."""
        pct = 100 * self.done / self.total if self.total else 100.0
        eta = self.eta_seconds()
        lost = sum(1 for f in self.servers.values() if f.status != "ok")
        hosts = f"{len(self.servers)} daemons" + (f" ({lost} not ok)" if lost else "")
        return (f"{self.done}/{self.total} requests ({pct:.0f}%), {self.failed} failed, "
                f"{self.tokens_per_second():.1f} tok/s, "
                f"ETA {'?' if eta is None else format_duration(eta)}, {hosts}")

    def describe_server(self, server: str) -> str:
        """"127.0.0.1:50051: 400 requests, 2 shards in flight, 170.2 tok/s, ok"."""
        f = self.servers.get(server, ServerFigures())
        return (f"{server}: {f.requests} requests, {f.in_flight} shards in flight, "
                f"{self.tokens_per_second(server):.1f} tok/s, {f.status}")

