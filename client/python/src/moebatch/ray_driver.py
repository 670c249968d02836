"""`moebatch shard`: one OpenAI batch input file across many moebatchd daemons under Ray, every
custom_id exactly once in one results file and one errors file, surviving lost daemon hosts and a
driver that dies and is rerun. docs/scale-out.md tells the whole story.

    from moebatch.ray_driver import run

    summary = run("prompts.jsonl", ["10.0.0.1:50051", "10.0.0.2:50051"], "results.jsonl")
    print(summary.completed, summary.failed, summary.errors)

Needs Ray (`pip install 'moebatch[ray]'`); this module imports it only when run() starts Ray.

The work directory (default OUT.shards/) holds the whole state of a run, every file written
atomically (moebatch.shard.atomic_file):

    input/manifest.json, input/shard-00000.jsonl, ...   the split (moebatch.shard.split_file)
    results/shard-00000.jsonl, ...                      a shard's result lines: the shard is done
    failed/shard-00007.jsonl, ...                       error lines of a shard that could not run
    state.json                                          the run's record (shard_plan.RunState)

One Ray actor per daemon (moebatch.shard_worker.DaemonWorker) submits shards with
moebatch.Client, a few at a time (`in_flight`) so that the daemon's queue never runs dry, follows
each job, and hands the finished shard's result lines back to the driver, which writes
results/<shard>.jsonl. Each job carries the run id and the shard's name and sha256 as metadata
(shard_plan.job_metadata); an actor adopts a daemon's existing job for a shard instead of creating
one, so a daemon that restarted, or a rerun of the driver, never submits a shard twice to one
daemon. A daemon unreachable for `lost_after` seconds is lost: its running shards go to the other
daemons (shard_plan.Planner).
At the end the result files are merged in the input's order (moebatch.shard.merge_shards).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .client import _read_pem, default_token
from .shard import (Manifest, atomic_file, atomic_write, error_line, file_sha256, merge_shards,
                    shard_custom_ids, split_file)
from .shard_plan import Planner, RunProgress, RunState, ServerFigures, format_duration, run_id
from .shard_worker import DaemonWorker

PROG = "moebatch shard"
RAY_SERVERS = "ray"  # run(servers=RAY_SERVERS): the daemons of moebatch.ray_daemons' group
RAY_HINT = "pip install 'moebatch[ray]' (or: pip install 'ray[default]>=2.40')"

class ShardRunError(Exception):
    """The run cannot go on: no daemon reachable, every daemon lost, the work dir belongs to
    another run or another driver holds it. What is done stays done; rerunning the same command
    resumes."""


# -- the driver -------------------------------------------------------------------------------

@dataclass
class RunSummary:
    """What a run did. `requests` counts the input's request lines (those left out included);
    completed + failed = requests when nothing is missing."""
    run_id: str
    output: str
    errors: str
    work_dir: str
    requests: int = 0
    completed: int = 0           # lines in the results file
    failed: int = 0              # lines in the errors file
    left_out: int = 0            # of those, lines the split left out (not JSON, no custom_id, ...)
    missing: int = 0             # custom_ids with no line at all (0 unless something is wrong)
    duplicates: int = 0          # result lines dropped at the merge (a shard run twice)
    shards: int = 0
    shards_run: int = 0          # shards finished in this session
    shards_adopted: int = 0      # of those, from a job that existed before this session
    failed_shards: dict[str, str] = field(default_factory=dict)  # shard -> why
    lost: list[str] = field(default_factory=list)       # daemons lost in this session
    excluded: dict[str, str] = field(default_factory=dict)  # daemon -> why it was not used
    moved: int = 0               # shards taken off lost daemons
    tokens: int = 0              # generated tokens of the shards finished in this session
    seconds: float = 0.0         # this session's wall time
    sessions: int = 0            # driver starts on this work dir

    @property
    def ok(self) -> bool:
        """Every request has its line and no shard failed."""
        return self.missing == 0 and not self.failed_shards

    def describe(self) -> str:
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        text = (f"{self.requests} requests: {self.completed} completed, {self.failed} failed "
                f"({self.left_out} left out by the split)")
        if self.missing:
            text += f", {self.missing} MISSING"
        text += (f"; {self.shards} shards ({self.shards_run} run now, {self.shards_adopted} of "
                 f"them adopted from existing jobs)")
        if self.lost:
            text += f"; lost {', '.join(self.lost)} ({self.moved} shards moved)"
        if self.failed_shards:
            text += f"; {len(self.failed_shards)} shards failed"
        text += (f"; {self.tokens} tokens generated, {rate:.1f} tok/s over "
                 f"{format_duration(self.seconds)}; results in {self.output}, errors in "
                 f"{self.errors}")
        return text


class _Display:
    """The run's progress on `stream`: on a terminal a tqdm bar over the requests with the run's
    figures, and one line per daemon (up to 16 daemons); otherwise a plain line every `interval`
    seconds (and the daemons' lines when there are up to 16, else those not ok). Messages go
    through note(). Single-threaded (the driver's loop)."""

    MAX_ROWS = 16

    def __init__(self, stream: TextIO | None, total: int, servers: list[str], interval: float):
        self.stream = stream
        self.servers = servers
        self.interval = interval
        self.tty = stream is not None and hasattr(stream, "isatty") and stream.isatty()
        self.bar = None
        self.rows: list[Any] = []
        self.last = 0.0
        self.total = total

    def _open(self) -> None:
        from tqdm import tqdm

        # The run's figures are the bar's description; the bar takes the rest of the line.
        self.bar = tqdm(total=self.total, file=self.stream, dynamic_ncols=True, unit="req",
                        bar_format="{desc} |{bar}|", desc=PROG)
        if len(self.servers) <= self.MAX_ROWS:
            self.rows = [tqdm(total=0, file=self.stream, position=i + 1, bar_format="{desc}",
                              dynamic_ncols=True, leave=False)
                         for i in range(len(self.servers))]

    def update(self, progress: RunProgress, force: bool = False) -> None:
        if self.stream is None:
            return
        if self.tty:
            if self.bar is None:
                self._open()
            self.bar.n = progress.done
            self.bar.set_description_str(f"{PROG}: {progress.describe()}", refresh=False)
            for row, server in zip(self.rows, self.servers):
                row.set_description_str("  " + progress.describe_server(server), refresh=False)
                row.refresh()
            self.bar.refresh()
            return
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        lines = [f"{PROG}: {progress.describe()}"]
        few = len(self.servers) <= self.MAX_ROWS
        for server in self.servers:
            figures = progress.servers.get(server)
            if few or (figures is not None and figures.status != "ok"):
                lines.append(f"{PROG}:   {progress.describe_server(server)}")
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()

    def note(self, message: str) -> None:
        if self.stream is None:
            return
        if self.bar is not None:
            from tqdm import tqdm

            tqdm.write(f"{PROG}: {message}", file=self.stream)
        else:
            self.stream.write(f"{PROG}: {message}\n")
            self.stream.flush()

    def close(self) -> None:
        for row in self.rows:
            row.close()
        self.rows = []
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def parse_servers(servers: str | Sequence[str]) -> list[str]:
    """"h1:p1,h2:p2" or a list of "host:port" -> the list, in order. Raises ValueError for none,
    one without a port, or one named twice."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [s.strip() for s in items if s.strip()]
    if not out:
        raise ValueError("servers: no daemon given (HOST:PORT,HOST:PORT,...)")
    for server in out:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"servers: {server!r} is not HOST:PORT")
    seen = set()
    for server in out:
        if server in seen:
            raise ValueError(f"servers: {server} is named twice")
        seen.add(server)
    return out


class _WorkDir:
    """The run's files (see the module docstring) and the lock that keeps a second driver off."""

    def __init__(self, path: Path):
        self.path = path
        self.input = path / "input"
        self.results = path / "results"
        self.failed = path / "failed"
        self._lock_file = None

    def open(self) -> None:
        for d in (self.path, self.input, self.results, self.failed):
            d.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.path / "lock", "a")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise ShardRunError(f"another driver is running on {self.path}") from None
        for d in (self.results, self.failed):  # temporary files of a driver killed mid-write
            for leftover in d.glob(".*.tmp"):
                leftover.unlink(missing_ok=True)

    def close(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def result(self, shard: str) -> Path:
        return self.results / f"{shard}.jsonl"

    def failure(self, shard: str) -> Path:
        return self.failed / f"{shard}.jsonl"


def _prepare(source: Path, work: _WorkDir, shard_requests: int, shard_tokens: int,
             note: Callable[[str], None]) -> Manifest:
    """The split: the work dir's when it is of this input (its limits stand), else a new one.
    Raises ShardRunError for a work dir of another input."""
    sha = file_sha256(source)
    try:
        manifest = Manifest.load(work.input)
    except FileNotFoundError:
        manifest = None
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ShardRunError(f"{work.input}: unreadable manifest ({e}); remove {work.path} or "
                            "give another --work-dir") from None
    if manifest is not None:
        if manifest.source_sha256 != sha:
            raise ShardRunError(
                f"{work.path} holds the shards of another input (sha256 "
                f"{manifest.source_sha256[:12]}..., {source} is {sha[:12]}...); remove it or "
                "give another --work-dir")
        if (manifest.max_requests, manifest.max_prompt_tokens) != (shard_requests, shard_tokens):
            note(f"resuming with the work dir's split ({len(manifest.shards)} shards of up to "
                 f"{manifest.max_requests} requests / {manifest.max_prompt_tokens} tokens)")
        return manifest
    manifest = split_file(source, work.input, max_requests=shard_requests,
                          max_prompt_tokens=shard_tokens)
    if manifest.source_sha256 != sha:
        raise ShardRunError(f"{source} changed while it was split; run again")
    return manifest


def _write_failed(work: _WorkDir, manifest: Manifest, shard: str, why: str) -> None:
    entry = next(s for s in manifest.shards if s.name == shard)
    with atomic_file(work.failure(shard), "w") as f:
        for custom_id in shard_custom_ids(work.input, entry):
            f.write(json.dumps(error_line(custom_id, "shard_failed", why),
                               ensure_ascii=False) + "\n")


def _group_servers() -> list[str]:
    """The addresses of the daemons `moebatch ray-daemons start` runs on the Ray cluster (Ray
    initialized). ShardRunError when there are none."""
    from . import ray_daemons

    found = ray_daemons.addresses()
    if not found:
        raise ShardRunError("servers 'ray': no daemon group runs on this Ray cluster; start one "
                            "with `moebatch ray-daemons start -- --model ...`")
    return found


def _ray_shutdown(started: bool) -> None:
    if started:
        import ray

        ray.shutdown()


def _ray_init(ray_address: str | None) -> bool:
    """Connects to the Ray cluster at ray_address (or $RAY_ADDRESS), or starts a local Ray.
    Returns True when this call started or connected Ray (and the run shuts it down). Raises
    ImportError, with how to install it, without Ray."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"moebatch.ray_driver runs on Ray: {RAY_HINT}") from e

    if ray.is_initialized():
        return False
    address = ray_address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    if address is None:
        kwargs["include_dashboard"] = False
    ray.init(address=address, **kwargs)
    return True


def _placements(servers: list[str]) -> list[Any]:
    """A scheduling strategy per daemon's actor: soft affinity to a live Ray node with the
    daemon's IP address (its own host), else the nodes in turn; several nodes with that address
    (one machine) are taken in turn too."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if not nodes:
        return [None] * len(servers)
    by_ip: dict[str, list[str]] = {}
    for node in nodes:
        by_ip.setdefault(node.get("NodeManagerAddress", ""), []).append(node["NodeID"])
    out = []
    turn: dict[str, int] = {}
    for i, server in enumerate(servers):
        host = server.rpartition(":")[0].strip("[]")
        try:
            ip = socket.gethostbyname(host)
        except OSError:
            ip = ""
        candidates = by_ip.get(ip) or [n["NodeID"] for n in nodes]
        key = ip if ip in by_ip else ""
        k = turn.get(key, 0)
        turn[key] = k + 1
        out.append(NodeAffinitySchedulingStrategy(node_id=candidates[k % len(candidates)],
                                                  soft=True))
    return out


def run(source: str | os.PathLike, servers: str | Sequence[str], output: str | os.PathLike,
        errors: str | os.PathLike | None = None, work_dir: str | os.PathLike | None = None, *,
        token: str | None = None, tls_ca: str | os.PathLike | None = None,
        tls_cert: str | os.PathLike | None = None, tls_key: str | os.PathLike | None = None,
        shard_requests: int = 1000, shard_tokens: int = 1_000_000, in_flight: int = 3,
        lost_after: float = 120.0, poll_interval: float = 1.0, timeout: float = 30.0,
        max_attempts: int = 3, ray_address: str | None = None,
        progress: TextIO | bool | None = True, interval: float = 10.0) -> RunSummary:
    """Runs the OpenAI batch file `source` across the daemons `servers` ("host:port" list, or
    one comma-separated string, or "ray": the daemons moebatch.ray_daemons runs) and writes every custom_id once: successful lines to `output`,
    failed ones (and lines the split left out) to `errors` (default: OUT with ".errors.jsonl"
    for ".jsonl"), both whole or not at all. Blocks until done; call it from one thread. Ray:
    connects to `ray_address` or $RAY_ADDRESS, else starts a local Ray (and stops it at the end).

    Rerunning with the same source and output (and work dir) resumes: shards with a result file
    are not run again, and jobs already on the daemons are adopted. work_dir: default
    "<output>.shards". shard_requests / shard_tokens: a shard's most requests and estimated
    prompt tokens (a new split only; a work dir's split stands). in_flight: shards submitted
    to a daemon at once. lost_after: seconds a daemon may fail every call before its running
    shards move to the others. poll_interval, timeout: seconds between a job's GetJob calls, and
    the deadline of each call. max_attempts: jobs per shard that may fail, be cancelled or expire
    before the shard's requests go to the errors file. token / tls_*: as moebatch.Client (token
    default $MOEBATCH_TOKEN). progress: the stream for the progress display and messages (True:
    sys.stderr; False or None: none); interval: seconds between plain progress lines when that
    stream is not a terminal.

    Returns a RunSummary (summary.ok: nothing missing and no shard failed). Raises ValueError
    for bad arguments or an unreadable or empty input file, ShardRunError when the run cannot go
    on (no daemon reachable, all lost, the work dir of another run), ImportError without Ray,
    OSError from the file system.
    """
    started = time.monotonic()
    ray_started = False
    if servers == RAY_SERVERS:
        ray_started = _ray_init(ray_address)
        try:
            server_list = _group_servers()
        except BaseException:
            _ray_shutdown(ray_started)
            raise
    else:
        server_list = parse_servers(servers)
    for name, value in (("shard_requests", shard_requests), ("shard_tokens", shard_tokens),
                        ("in_flight", in_flight), ("max_attempts", max_attempts)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    for name, value in (("lost_after", lost_after), ("poll_interval", poll_interval),
                        ("timeout", timeout), ("interval", interval)):
        if not value > 0:
            raise ValueError(f"{name}: must be a positive number of seconds, got {value!r}")
    source = Path(source)
    try:
        with source.open("rb") as f:
            if not f.read(1):
                raise ValueError(f"{source} is empty")
    except OSError as e:
        raise ValueError(f"cannot read {source}: {e.strerror or e}") from None
    output = Path(output)
    if not output.parent.resolve().is_dir():
        raise ValueError(f"cannot write {output}: no directory {output.parent}")
    errors = Path(errors) if errors is not None else output.with_name(
        output.name.removesuffix(".jsonl") + ".errors.jsonl")
    if not errors.parent.resolve().is_dir():
        raise ValueError(f"cannot write {errors}: no directory {errors.parent}")
    if errors.resolve() == output.resolve():
        raise ValueError("the errors file must not be the output file")
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together")
    client_tls = {"tls_ca": _read_pem("tls_ca", tls_ca),
                  "tls_cert": _read_pem("tls_cert", tls_cert),
                  "tls_key": _read_pem("tls_key", tls_key)}
    token = token if token is not None else (default_token() or "")

    work = _WorkDir(Path(work_dir) if work_dir is not None
                    else output.with_name(output.name + ".shards"))
    stream = sys.stderr if progress is True else (progress or None)
    display = _Display(stream, 0, server_list, interval)
    work.open()
    try:
        manifest = _prepare(source, work, shard_requests, shard_tokens, display.note)
        if manifest.requests == 0 and not manifest.invalid:
            raise ValueError(f"{source} has no requests")
        if manifest.requests == 0:
            first = manifest.invalid[0]
            raise ValueError(f"no line of {source} is a request ({len(manifest.invalid)} left "
                             f"out; line {first['line']}: {first['message']})")
        rid = run_id(manifest.source_sha256, output)
        state = RunState.load(work.path)
        if state is not None and state.run_id != rid:
            raise ShardRunError(f"{work.path} belongs to the run writing {state.output}; give "
                                "another --work-dir")
        if state is None:
            state = RunState(run_id=rid, source=str(source), source_sha256=manifest.source_sha256,
                             output=str(output), errors=str(errors), created_at=time.time())
        state.sessions += 1
        state.servers = server_list
        state.errors = str(errors)
        state.finished = False
        state.save(work.path)
        summary = RunSummary(run_id=rid, output=str(output), errors=str(errors),
                             work_dir=str(work.path), shards=len(manifest.shards),
                             sessions=state.sessions)
        names = [s.name for s in manifest.shards]
        done = {n for n in names if work.result(n).exists()}
        if len(done) < len(names):
            display.total = manifest.requests
            _Driver(manifest, work, state, summary, server_list, done, display,
                    worker_args={"token": token, **client_tls, "timeout": timeout,
                                 "poll_interval": poll_interval},
                    in_flight=in_flight, lost_after=lost_after, max_attempts=max_attempts,
                    ray_address=ray_address).run()
        display.close()

        def files(shard):
            for path in (work.result(shard.name), work.failure(shard.name)):
                if path.exists():
                    return [path]
            return []

        report = merge_shards(manifest, work.input, files, output, errors)
        summary.requests = manifest.requests + len(manifest.invalid)
        summary.completed, summary.failed = report.completed, report.failed
        summary.left_out = len(manifest.invalid)
        summary.missing, summary.duplicates = len(report.missing), report.duplicates
        summary.failed_shards = {n: state.shards[n].get("message", "")
                                 for n in names if not work.result(n).exists()
                                 and n in state.shards}
        summary.seconds = time.monotonic() - started
        state.finished = summary.ok
        state.save(work.path)
        return summary
    finally:
        display.close()
        work.close()
        _ray_shutdown(ray_started)


class _Driver:
    """The loop of one driver session: assigns shards to the actors, collects outcomes and the
    actors' status, declares daemons lost and revives them, writes result files and the state,
    and shows progress. Single-threaded."""

    STATE_EVERY = 2.0    # seconds between state.json writes while running
    LOOP_EVERY = 0.5     # seconds the loop waits for outcomes before it looks at the rest

    def __init__(self, manifest: Manifest, work: _WorkDir, state: RunState, summary: RunSummary,
                 servers: list[str], done: set[str], display: _Display,
                 worker_args: dict[str, Any], in_flight: int, lost_after: float,
                 max_attempts: int, ray_address: str | None):
        self.manifest = manifest
        self.shards = {s.name: s for s in manifest.shards}
        self.work = work
        self.state = state
        self.summary = summary
        self.servers = servers
        self.display = display
        self.worker_args = worker_args
        self.lost_after = lost_after
        self.probe_every = max(1.0, min(lost_after / 2, 10.0))
        # Each actor reports every half second; with many daemons less often (50 reports/s).
        self.status_every = max(0.5, len(servers) / 50)
        self.last_status: dict[str, float] = {}
        self.ray_address = ray_address
        self.planner = Planner([s.name for s in manifest.shards], servers, in_flight,
                               max_attempts=max_attempts, done=done)
        self.base_requests = sum(self.shards[n].requests for n in done)
        self.figures = {s: ServerFigures() for s in servers}
        self.live: dict[str, dict[str, Any]] = {s: {} for s in servers}
        # (server, job ids...) -> generated tokens when this session first saw the jobs
        self.seen_tokens: dict[tuple[str, ...], int] = {}
        self.progress = RunProgress(manifest.requests)
        self.actors: dict[str, Any] = {}
        self.calls: dict[Any, tuple[str, str]] = {}     # run_shard ref -> (server, shard)
        self.status_calls: dict[Any, str] = {}
        self.probe_calls: dict[Any, str] = {}
        self.last_probe: dict[str, float] = {}
        self.no_daemon_since: float | None = None

    # -- set-up ----------------------------------------------------------------------------

    def _start(self) -> None:
        import ray

        worker = ray.remote(DaemonWorker)
        concurrency = 2 * self.planner.cap[self.servers[0]] + 16
        for server, strategy in zip(self.servers, _placements(self.servers)):
            options: dict[str, Any] = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": 0,
                                       "max_concurrency": concurrency}
            if strategy is not None:
                options["scheduling_strategy"] = strategy
            self.actors[server] = worker.options(**options).remote(
                server, self.state.run_id, **self.worker_args)
        probes = {server: actor.probe.remote() for server, actor in self.actors.items()}
        reachable, failures = [], []
        for server, ref in probes.items():
            try:
                answer = ray.get(ref, timeout=max(30.0, self.lost_after))
            except Exception as e:  # the actor could not start, or did not answer in time
                answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            if answer["ok"]:
                reachable.append(server)
                self.planner.note_jobs(server, self._matching(answer["held"]))
            else:
                failures.append(f"{server}: {answer['error']}")
                self._lose(server, f"no answer at the start: {answer['error']}")
        if not reachable:
            raise ShardRunError("no daemon reachable: " + "; ".join(failures))

    def _matching(self, held: dict[str, list[str]]) -> list[str]:
        """The shards of `held` ({shard: sha256s}) whose job matches the split's shard."""
        return [name for name, shas in held.items()
                if name in self.shards and self.shards[name].sha256 in shas]

    # -- outcomes --------------------------------------------------------------------------

    def _record(self, shard: str, server: str, job: str, state: str, message: str = "") -> None:
        entry = {"server": server, "job": job, "state": state}
        if message:
            entry["message"] = message
        self.state.shards[shard] = entry

    def _failed(self, shard: str, why: str) -> None:
        self.planner.fail(shard, why)
        _write_failed(self.work, self.manifest, shard, why)
        self._record(shard, self.state.shards.get(shard, {}).get("server", ""), "", "failed", why)
        self.display.note(f"{shard} failed: {why}")

    def _outcome(self, server: str, shard: str, outcome: dict[str, Any]) -> None:
        status = outcome["status"]
        if status == "done":
            if shard in self.planner.done:
                return  # a late duplicate: the first result file stands
            atomic_write(self.work.result(shard), outcome["lines"])
            self.work.failure(shard).unlink(missing_ok=True)
            for other in self.planner.finish(shard, server):
                if self.planner.usable(other):
                    self.actors[other].cancel.remote(shard)
            self._record(shard, server, ",".join(outcome["jobs"]), "done")
            self.live[server].pop(shard, None)
            f = self.figures[server]
            f.requests += outcome["requests"]
            f.failed += outcome["failed"]
            f.tokens += outcome["tokens"] - self.seen_tokens.pop((server, *outcome["jobs"]), 0)
            self.summary.shards_run += 1
            self.summary.shards_adopted += bool(outcome["adopted"])
            self.summary.tokens += outcome["tokens"]
        elif status == "ended":
            if self.planner.job_ended(shard, server, f"job {outcome['job']} "
                                                     f"{outcome['state']}: {outcome['message']}"):
                self._failed(shard, self.planner.failed[shard])
            else:
                self.display.note(f"{shard}: job {outcome['job']} on {server} "
                                  f"{outcome['state']} ({outcome['message']}); running it again")
        elif status == "busy":
            if self.planner.busy(server, shard, outcome["message"]):
                self._failed(shard, self.planner.failed[shard])
            else:
                self.display.note(f"{server} is full ({outcome['message']}); at most "
                                  f"{self.planner.cap[server]} shards there from now on")
        elif status == "refused":
            self._failed(shard, f"{server} refused it: {outcome['message']}")
        elif status == "excluded":
            self._exclude(server, outcome["message"])
            self.planner.requeue(shard)
        # "abandoned": the shard was moved on already

    def _exclude(self, server: str, why: str) -> None:
        if server in self.planner.excluded:
            return
        moved = self.planner.exclude(server, why)
        self._drop_calls(server, moved)
        self.figures[server].status = "excluded"
        self.summary.excluded[server] = why
        self.display.note(f"{server} refuses this driver ({why}); not used")

    def _drop_calls(self, server: str, shards: list[str]) -> None:
        for ref, (s, shard) in list(self.calls.items()):
            if s == server and shard in shards:
                del self.calls[ref]
        if shards:
            self.actors[server].abandon.remote(shards)
        for shard in shards:
            self.live[server].pop(shard, None)

    def _lose(self, server: str, why: str) -> None:
        moved = self.planner.lose(server)
        self._drop_calls(server, moved)
        self.state.lost[server] = time.time()
        if server not in self.summary.lost:
            self.summary.lost.append(server)
        self.summary.moved += len(moved)
        self.figures[server].status = "lost"
        self.last_probe[server] = time.monotonic()
        self.display.note(f"{server} lost ({why}); {len(moved)} shards move to the other daemons")

    # -- the loop --------------------------------------------------------------------------

    def _submit(self) -> None:
        for server, shard in self.planner.assign():
            entry = self.shards[shard]
            data = (self.work.input / entry.file).read_bytes()
            ref = self.actors[server].run_shard.remote(shard, entry.sha256, data)
            self.calls[ref] = (server, shard)
            self._record(shard, server, "", "running")

    def _collect(self, wait: float) -> None:
        import ray
        from ray.exceptions import RayActorError

        if not self.calls:
            time.sleep(wait)
            return
        ready, _ = ray.wait(list(self.calls), num_returns=len(self.calls), timeout=wait)
        for ref in ready:
            if ref not in self.calls:
                continue
            server, shard = self.calls.pop(ref)
            try:
                outcome = ray.get(ref)
            except RayActorError as e:  # the actor died (Ray restarts it): the shard runs again
                self.planner.requeue(shard)
                self.live[server].pop(shard, None)
                self.display.note(f"{shard} on {server}: {type(e).__name__}; running it again")
                continue
            except Exception as e:  # run_shard raised: counts as a job that ended badly
                self.live[server].pop(shard, None)
                why = f"{type(e).__name__}: {e}".splitlines()[0]
                if self.planner.job_ended(shard, server, why):
                    self._failed(shard, self.planner.failed[shard])
                else:
                    self.display.note(f"{shard} on {server}: {why}; running it again")
                continue
            self._outcome(server, shard, outcome)

    def _poll_status(self) -> None:
        import ray

        now = time.monotonic()
        asked = set(self.status_calls.values())
        for server, actor in self.actors.items():
            if (server not in asked and server not in self.planner.excluded
                    and now - self.last_status.get(server, 0.0) >= self.status_every):
                self.last_status[server] = now
                self.status_calls[actor.status.remote()] = server
        ready, _ = ray.wait(list(self.status_calls), num_returns=len(self.status_calls),
                            timeout=0)
        for ref in ready:
            server = self.status_calls.pop(ref)
            try:
                status = ray.get(ref)
            except Exception:
                continue
            if server in self.planner.lost:
                continue
            live = {s: v for s, v in status["live"].items()
                    if self.planner.running.get(s) == server}
            for shard, v in live.items():
                self.seen_tokens.setdefault((server, *v["jobs"]), v["tokens"])
            self.live[server] = live
            down = status["down_for"]
            if down is None:
                self.figures[server].status = "ok"
            elif down >= self.lost_after:
                self._lose(server, f"no answer for {down:.0f}s: {status['error']}")
            else:
                self.figures[server].status = f"unreachable {down:.0f}s"

    def _probe_lost(self) -> None:
        import ray

        now = time.monotonic()
        for server in sorted(self.planner.lost):
            if server in self.probe_calls.values():
                continue
            if now - self.last_probe.get(server, 0.0) >= self.probe_every:
                self.last_probe[server] = now
                self.probe_calls[self.actors[server].probe.remote()] = server
        ready, _ = ray.wait(list(self.probe_calls), num_returns=len(self.probe_calls), timeout=0)
        for ref in ready:
            server = self.probe_calls.pop(ref)
            try:
                answer = ray.get(ref)
            except Exception:
                continue
            if not answer["ok"] or server not in self.planner.lost:
                continue
            surplus = self.planner.revive(server, self._matching(answer["held"]))
            self.state.lost.pop(server, None)
            for shard in surplus:
                self.actors[server].cancel.remote(shard)
            self.figures[server].status = "ok"
            self.display.note(f"{server} answers again and is used again (its jobs for "
                              f"{len(surplus)} shards done elsewhere are cancelled)")

    def _figures(self) -> dict[str, ServerFigures]:
        out = {}
        for server in self.servers:
            base = self.figures[server]
            f = ServerFigures(requests=base.requests, failed=base.failed, tokens=base.tokens,
                              in_flight=len(self.planner.in_flight[server]), status=base.status)
            for v in self.live[server].values():
                f.requests += v["done"]
                f.failed += v["failed"]
                f.tokens += v["tokens"] - self.seen_tokens.get((server, *v["jobs"]), v["tokens"])
            out[server] = f
        return out

    def run(self) -> None:
        _ray_started = _ray_init(self.ray_address)
        try:
            self._start()
            last_state = time.monotonic()
            self._submit()
            while not self.planner.complete:
                self._collect(self.LOOP_EVERY)
                self._poll_status()
                self._probe_lost()
                self._submit()
                now = time.monotonic()
                if self.planner.usable_servers:
                    self.no_daemon_since = None
                elif self.no_daemon_since is None:
                    self.no_daemon_since = now
                elif now - self.no_daemon_since > self.lost_after + self.probe_every:
                    gone = [f"{s} lost" for s in sorted(self.planner.lost)] + [
                        f"{s} refused: {why}" for s, why in sorted(self.planner.excluded.items())]
                    raise ShardRunError(
                        f"no daemon left ({'; '.join(gone)}); {len(self.planner.done)} of "
                        f"{len(self.shards)} shards are done. Rerun the same command to resume.")
                self.progress.update(self._figures(), self.base_requests)
                self.display.update(self.progress)
                if now - last_state >= self.STATE_EVERY:
                    self.state.save(self.work.path)
                    last_state = now
            self.progress.update(self._figures(), self.base_requests)
            self.display.update(self.progress, force=True)
        finally:
            self.state.save(self.work.path)
            self.summary.excluded.update(self.planner.excluded)
            _ray_shutdown(_ray_started)
