"""The `moebatch` command: submit batch jobs to moebatchd and fetch their results.

    moebatch submit prompts.jsonl --wait          # progress bar on stderr, final job on stdout
    moebatch watch JOB                            # the same progress bar for any job
    moebatch status JOB                           # the job as JSON; a summary on stderr
    moebatch list [--state completed]
    moebatch results JOB -o results.jsonl
    moebatch cancel JOB
    moebatch shard prompts.jsonl --servers H1:P,H2:P -o results.jsonl   # many daemons, on Ray
    moebatch ray-daemons start -- --model M       # one daemon per Ray GPU node (--servers ray)

Every command takes --server HOST:PORT (default $MOEBATCH_SERVER, else 127.0.0.1:50051), but
`shard`, which takes --servers (moebatch.ray_driver; docs/scale-out.md), and `ray-daemons`
(moebatch.ray_daemons).
Exit codes: 0 ok; 1 the server refused or failed the call, or a waited-for (or watched) job ended
failed or cancelled (message on stderr, e.g. "moebatch: NOT_FOUND: job job_x not found"), or a
shard run could not finish (a shard failed, no daemon reachable); 2 bad usage or an unreadable
input file (and `shard` without Ray installed); 130 interrupted.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import sys
import time
from typing import TextIO

import grpc

from . import __version__
from .client import DEFAULT_SERVER, DEFAULT_TIMEOUT, Client, default_server
from .errors import ClientError
from .jobs import STATE_NAMES, TERMINAL_STATES, job_to_dict, parse_state, state_name
from .shard import atomic_file
from .v1 import batch_pb2 as pb

PROG = "moebatch"
EXIT_OK, EXIT_SERVER, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
SHARD_TIMEOUT = 30.0  # `shard`: the deadline of each call to a daemon, seconds


class UsageError(Exception):
    """Bad input from the user (exit code 2)."""


class JobEndedBadly(Exception):
    """A waited-for job ended failed or cancelled (exit code 1)."""


# -- argument parsing -------------------------------------------------------------------------

def _metadata_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _state(text: str) -> int:
    try:
        return parse_state(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("state: ")) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    # --server/--timeout are accepted before or after the command; SUPPRESS keeps a subcommand's
    # parser from overwriting a value given before the command with its default.
    def connection(server: bool, timeout: float) -> argparse.ArgumentParser:
        """The connection options: --server (when `server`), --token, TLS, and --timeout with
        `timeout` seconds as the default its help names."""
        parent = argparse.ArgumentParser(add_help=False)
        if server:
            parent.add_argument(
                "--server", metavar="HOST:PORT", default=argparse.SUPPRESS,
                help=f"moebatchd's address (default: $MOEBATCH_SERVER or {DEFAULT_SERVER})")
        parent.add_argument(
            "--token", metavar="TOKEN", default=argparse.SUPPRESS,
            help="bearer token (default: $MOEBATCH_TOKEN); needed when the daemon has a tokens "
                 "file")
        parent.add_argument(
            "--tls-ca", metavar="PEM", default=argparse.SUPPRESS,
            help="use TLS, trusting the CA certificates in this file")
        parent.add_argument(
            "--tls-cert", metavar="PEM", default=argparse.SUPPRESS,
            help="client certificate for mutual TLS (with --tls-key)")
        parent.add_argument(
            "--tls-key", metavar="PEM", default=argparse.SUPPRESS, help="key of --tls-cert")
        parent.add_argument(
            "--timeout", metavar="SECONDS", type=_positive_float, default=argparse.SUPPRESS,
            help=f"deadline of each single call (default {timeout:g}); "
                 "waiting for a job has none")
        return parent

    common = connection(server=True, timeout=DEFAULT_TIMEOUT)

    parser = argparse.ArgumentParser(
        prog=PROG, parents=[common],
        description="Submit OpenAI-batch JSONL jobs to moebatchd and fetch their results.",
        epilog="exit codes: 0 ok, 1 server error or a waited-for/watched job failed/cancelled, "
               "2 usage error, 130 interrupted")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("submit", parents=[common], help="submit a JSONL file as a job",
                       description="Submit an OpenAI batch input file (one request per line) "
                                   "as a job; prints the job as JSON.")
    p.add_argument("file", metavar="FILE.jsonl")
    p.add_argument("--wait", action="store_true",
                   help="wait for the job to finish, with a progress bar on stderr")
    p.add_argument("--metadata", metavar="KEY=VALUE", action="append", type=_metadata_pair,
                   default=[], help="metadata kept with the job (repeatable)")
    p.add_argument("--model", default="", help="the daemon's model name (default: any)")
    p.add_argument("--no-progress", action="store_true",
                   help="with --wait: no progress display")
    p.add_argument("--interval", type=_positive_float, default=5.0, metavar="SECONDS",
                   help="with --wait, stderr not a terminal: a progress line at most every "
                        "SECONDS, and at each state change (default 5)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("watch", parents=[common], help="follow a job with a progress bar",
                       description="Follow a job (any job: submitted by another process, "
                                   "running or finished) with a progress bar on stderr until it "
                                   "ends; prints the final job as JSON. Exits 0 when the job "
                                   "completed, 1 when it failed or was cancelled.")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("--interval", type=_positive_float, default=5.0, metavar="SECONDS",
                   help="stderr not a terminal: a progress line at most every SECONDS, and at "
                        "each state change (default 5)")
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("status", parents=[common], help="show a job",
                       description="Print a job as JSON on stdout, and a summary on stderr: "
                                   "state, requests, start time (local), tokens and the "
                                   "daemon's rate.")
    p.add_argument("job", metavar="JOB")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("list", parents=[common], help="list jobs, newest first",
                       description="List jobs, newest first.")
    p.add_argument("--state", type=_state, metavar="STATE",
                   help=f"only jobs in this state ({', '.join(STATE_NAMES)})")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="at most N jobs")
    p.add_argument("--page-size", type=_positive_int, default=100, metavar="N",
                   help="jobs fetched per call (default 100)")
    p.add_argument("--json", action="store_true", help="one JSON object per job")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("results", parents=[common], help="write a job's results as JSONL",
                       description="Write a job's OpenAI batch output lines in input order; "
                                   "waits for the job to finish unless --no-wait.")
    p.add_argument("job", metavar="JOB")
    p.add_argument("-o", "--output", metavar="OUT.jsonl", default="-",
                   help="output file (default: stdout); written whole or not at all")
    p.add_argument("--no-wait", action="store_true",
                   help="only the results committed so far")
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("cancel", parents=[common], help="cancel a job",
                       description="Cancel a job; prints it as JSON.")
    p.add_argument("job", metavar="JOB")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("delete", parents=[common], help="delete a finished job",
                       description="Delete a finished job with its results (cancel a running "
                                   "one first).")
    p.add_argument("job", metavar="JOB")
    p.set_defaults(func=cmd_delete)

    p = sub.add_parser(
        "shard", parents=[connection(server=False, timeout=SHARD_TIMEOUT)],
        help="run one file across many daemons (Ray)",
        description="Split an OpenAI batch input file into shards and run them across several "
                    "moebatchd daemons under Ray (one actor per daemon, a few shards in flight "
                    "on each); write every custom_id once, successful lines to OUT and the "
                    "others to the errors file. A daemon that does not answer for --lost-after "
                    "seconds is lost and its shards move to the others. Rerunning the same "
                    "command resumes: finished shards are not run again, and jobs already on "
                    "the daemons are adopted. Needs Ray: pip install 'moebatch[ray]'. "
                    "See docs/scale-out.md.",
        epilog="Ray: --ray-address or $RAY_ADDRESS, else a local Ray is started. Exit codes: "
               "0 every request has its line, 1 a shard failed or the run could not finish "
               "(rerun to resume), 2 usage error or no Ray, 130 interrupted.")
    p.add_argument("file", metavar="FILE.jsonl")
    p.add_argument("--servers", metavar="HOST:PORT,...", required=True,
                   help="the daemons, comma-separated; `ray`: those `moebatch ray-daemons "
                        "start` runs on the Ray cluster")
    p.add_argument("-o", "--output", metavar="OUT.jsonl", required=True,
                   help="the results file (written whole at the end)")
    p.add_argument("--errors", metavar="ERR.jsonl",
                   help="the errors file (default: OUT with .errors.jsonl for .jsonl)")
    p.add_argument("--work-dir", metavar="DIR",
                   help="the run's shards, results and state (default: OUT.shards)")
    p.add_argument("--shard-requests", type=_positive_int, default=1000, metavar="N",
                   help="most requests per shard (default 1000; a new split only)")
    p.add_argument("--shard-tokens", type=_positive_int, default=1_000_000, metavar="N",
                   help="most estimated prompt tokens per shard (default 1000000)")
    p.add_argument("--in-flight", type=_positive_int, default=3, metavar="N",
                   help="shards submitted to each daemon at once (default 3)")
    p.add_argument("--lost-after", type=_positive_float, default=120.0, metavar="SECONDS",
                   help="a daemon failing every call this long is lost and its shards move "
                        "(default 120)")
    p.add_argument("--poll-interval", type=_positive_float, default=1.0, metavar="SECONDS",
                   help="seconds between status calls of a running job (default 1)")
    p.add_argument("--max-attempts", type=_positive_int, default=3, metavar="N",
                   help="jobs of a shard that may fail, be cancelled or expire before its "
                        "requests go to the errors file (default 3)")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="the Ray cluster (default: $RAY_ADDRESS, else a local Ray)")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("--interval", type=_positive_float, default=10.0, metavar="SECONDS",
                   help="stderr not a terminal: a progress line every SECONDS (default 10)")
    p.set_defaults(func=cmd_shard, no_client=True)

    p = sub.add_parser(
        "ray-daemons", help="one moebatchd per GPU node of a Ray cluster",
        usage=f"{PROG} ray-daemons {{start,list,stop}} [options] [-- MOEBATCHD_ARGS...]",
        description="Start, list or stop one moebatchd per Ray node that has GPUs, each in a "
                    "bundle of a placement group spread over the nodes; the daemons outlive "
                    "this command (detached actors restart them when they exit) until `stop`. "
                    "`moebatch shard --servers ray` uses them. start: moebatchd's own "
                    "arguments follow `--` (its --model and options; not --listen or "
                    "--data-dir). Needs Ray. See docs/scale-out.md.",
        epilog="Ray: --ray-address or $RAY_ADDRESS, else a local Ray is started (start only "
               "makes sense on a running cluster). Exit codes: 0 ok, 1 the cluster cannot host "
               "the daemons, 2 usage error or no Ray.")
    p.add_argument("action", choices=["start", "list", "stop"])
    p.add_argument("--moebatchd", default="moebatchd", metavar="PATH",
                   help="the moebatchd program on the nodes (default: moebatchd on PATH)")
    p.add_argument("--gpus", type=_positive_float, default=1.0, metavar="N",
                   help="GPUs per daemon; a node needs that many to get one (default 1)")
    p.add_argument("--port", type=int, default=50051, metavar="PORT",
                   help="each daemon's gRPC port on its node; 0: a free one (default 50051)")
    p.add_argument("--data-dir", default="~/.moebatch/ray-daemons/{node}", metavar="DIR",
                   help="the job store on each node; {node} is the Ray node id's first 12 hex "
                        "digits (default ~/.moebatch/ray-daemons/{node})")
    p.add_argument("--min-nodes", type=_positive_int, default=1, metavar="N",
                   help="start: wait for at least N GPU nodes (default 1)")
    p.add_argument("--wait", type=_positive_float, default=600.0, metavar="SECONDS",
                   help="start: how long to wait for the nodes, and for each daemon to load its "
                        "model and serve (default 600)")
    p.add_argument("--grace", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="stop: seconds between SIGTERM and SIGKILL (default 60)")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="the Ray cluster (default: $RAY_ADDRESS, else a local Ray)")
    p.set_defaults(func=cmd_ray_daemons, no_client=True, daemon_args=[])
    return parser


# -- output helpers ---------------------------------------------------------------------------

def _print_job(job: pb.Job, out: TextIO) -> None:
    out.write(json.dumps(job_to_dict(job), indent=2, ensure_ascii=False) + "\n")
    out.flush()


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_fraction(p: pb.JobProgress) -> float:
    """How much of the job is done, in [0, 1]: the larger of the fraction of requests done and
    the fraction of max_tokens_total generated (requests run side by side for most of a job, so
    the request fraction lags; requests that stop early make the token fraction lag). 1 once
    the job completed."""
    if p.state == pb.JOB_STATE_COMPLETED:
        return 1.0
    c = p.request_counts
    fraction = (c.completed + c.failed) / c.total if c.total > 0 else 0.0
    if p.max_tokens_total > 0:
        fraction = max(fraction, p.generated_tokens / p.max_tokens_total)
    return min(1.0, max(0.0, fraction))


def _tokens(p: pb.JobProgress) -> str:
    if p.max_tokens_total > 0:
        return f"{p.generated_tokens}/{p.max_tokens_total} tokens"
    return f"{p.generated_tokens} tokens"


def _eta(p: pb.JobProgress) -> str:
    return format_duration(p.eta_seconds) if p.eta_seconds > 0 else "?"


def describe_progress(p: pb.JobProgress) -> str:
    """"in_progress 120/805 done (2 failed), 15360/206080 tokens, 34%, 1234.5 tok/s,
    0:12 elapsed, ETA 0:42" (the percentage is progress_fraction)."""
    c = p.request_counts
    return (f"{state_name(p.state)} {c.completed + c.failed}/{c.total} done ({c.failed} failed), "
            f"{_tokens(p)}, {100 * progress_fraction(p):.0f}%, {p.tokens_per_second:.1f} tok/s, "
            f"{format_duration(p.elapsed_seconds)} elapsed, ETA {_eta(p)}")


class ProgressDisplay:
    """Shows JobProgress on stderr: a tqdm bar on a terminal, else a plain line at most every
    `interval` seconds and at each state change (logs stay readable). The bar's fill is
    progress_fraction (tokens as well as requests, so it moves while requests run); elapsed time,
    tok/s and ETA are the daemon's job clock."""

    SCALE = 1000  # the bar's units: thousandths of the job

    def __init__(self, job_id: str, stream: TextIO, interval: float = 5.0):
        self.job_id = job_id
        self.stream = stream
        self.interval = interval
        self.bar = None
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.last_line = 0.0
        self.last_state: int | None = None

    @staticmethod
    def postfix(p: pb.JobProgress) -> str:
        """"120/805 req (2 failed), 15360/206080 tok, 1234.5 tok/s, 0:12, ETA 0:42"."""
        c = p.request_counts
        tokens = _tokens(p).replace(" tokens", " tok")
        return (f"{c.completed + c.failed}/{c.total} req ({c.failed} failed), {tokens}, "
                f"{p.tokens_per_second:.1f} tok/s, {format_duration(p.elapsed_seconds)}, "
                f"ETA {_eta(p)}")

    def update(self, p: pb.JobProgress) -> None:
        if self.tty:
            from tqdm import tqdm

            if self.bar is None:
                self.bar = tqdm(total=self.SCALE, file=self.stream, dynamic_ncols=True,
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")
            self.bar.n = round(self.SCALE * progress_fraction(p))
            self.bar.set_description_str(f"{self.job_id} {state_name(p.state)}", refresh=False)
            self.bar.set_postfix_str(self.postfix(p), refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if p.state != self.last_state or now - self.last_line >= self.interval:
            self.stream.write(f"{PROG}: {self.job_id} {describe_progress(p)}\n")
            self.stream.flush()
            self.last_line, self.last_state = now, p.state

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# -- commands ---------------------------------------------------------------------------------

def _follow(client: Client, job_id: str, args: argparse.Namespace,
            since: float | None = None) -> int:
    """Follows the job to its end with a progress display (unless args.no_progress; plain lines
    every args.interval seconds), then prints a summary on stderr and the final job on stdout.
    `since`: time.monotonic() at submission, for the wall time in the summary. Raises
    JobEndedBadly when the job failed or was cancelled."""
    display = (None if args.no_progress
               else ProgressDisplay(job_id, sys.stderr, interval=args.interval))
    try:
        job, last = client.wait(job_id, on_progress=display.update if display else None)
    except KeyboardInterrupt:
        if display:
            display.close()
        print(f"{PROG}: stopped waiting; {job_id} goes on (`{PROG} cancel {job_id}` stops it)",
              file=sys.stderr)
        raise
    finally:
        if display:
            display.close()
    c = job.request_counts
    summary = (f"{PROG}: {job.id} {state_name(job.state)}: {c.completed} completed, "
               f"{c.failed} failed of {c.total} requests in {job.elapsed_seconds:.2f}s")
    if since is not None:
        summary += f" ({time.monotonic() - since:.1f}s since submission)"
    if last is not None:
        summary += (f"; {last.prompt_tokens} prompt tokens, {last.generated_tokens} generated "
                    f"tokens, {last.tokens_per_second:.1f} tok/s")
    print(summary, file=sys.stderr)
    _print_job(job, sys.stdout)
    if job.state == pb.JOB_STATE_FAILED:
        raise JobEndedBadly(f"job {job.id} failed: {job.error or 'no reason given'}")
    if job.state == pb.JOB_STATE_CANCELLED:
        raise JobEndedBadly(f"job {job.id} was cancelled")
    if job.state == pb.JOB_STATE_EXPIRED:
        raise JobEndedBadly(f"job {job.id} expired: its completion window passed")
    return EXIT_OK


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    try:
        with open(args.file, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"cannot read {args.file}: {e.strerror or e}") from None
    started = time.monotonic()
    try:
        job = client.create_job(jsonl=data, metadata=dict(args.metadata), model=args.model)
    except ValueError as e:  # raised before any call: bad metadata or arguments
        raise UsageError(str(e)) from None
    if not args.wait:
        _print_job(job, sys.stdout)
        return EXIT_OK
    c = job.request_counts
    print(f"{PROG}: submitted {job.id} ({c.total} requests)", file=sys.stderr, flush=True)
    return _follow(client, job.id, args, since=started)


def cmd_watch(client: Client, args: argparse.Namespace) -> int:
    job = client.get_job(args.job)  # NOT_FOUND before any display
    if job.state not in TERMINAL_STATES:
        c = job.request_counts
        print(f"{PROG}: watching {job.id} ({c.total} requests)", file=sys.stderr, flush=True)
    return _follow(client, job.id, args)


def _timestamp(seconds: int, zone: bool = False) -> str:
    """Unix seconds as local time, "2026-11-27 14:03:09" ("... CET" with `zone`); "-" for 0."""
    if seconds <= 0:
        return "-"
    moment = _dt.datetime.fromtimestamp(seconds).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z" if zone else "%Y-%m-%d %H:%M:%S")


def job_start(job: pb.Job, now: float | None = None) -> int:
    """When the job started running, Unix seconds (0: not yet): its end (finished_at, or now
    while it runs) less the daemon's elapsed_seconds, so from the job clock (the store's
    started_at is the time of the first result); started_at when the daemon has no clock for
    it."""
    if job.elapsed_seconds > 0:
        end = job.finished_at if job.finished_at > 0 else (time.time() if now is None else now)
        return max(int(end - job.elapsed_seconds), job.created_at)
    return job.started_at


def describe_job(job: pb.Job) -> str:
    """A job in one line for people, times local: "job_x in_progress: 120/805 done (2 failed);
    started 2026-11-27 14:03:09 CET, ran 42.10s; 9630 prompt tokens, 15360 generated tokens,
    364.8 tok/s". Tokens are those of the requests with a result; the rate is the daemon's."""
    c = job.request_counts
    text = (f"{job.id} {state_name(job.state)}: {c.completed + c.failed}/{c.total} done "
            f"({c.failed} failed)")
    start = job_start(job)
    if start > 0:
        text += f"; started {_timestamp(start, zone=True)}, ran {job.elapsed_seconds:.2f}s"
    else:
        text += f"; not started (created {_timestamp(job.created_at, zone=True)})"
    if job.finished_at > 0:
        text += f", finished {_timestamp(job.finished_at, zone=True)}"
    text += (f"; {job.prompt_tokens} prompt tokens, {job.generated_tokens} generated tokens, "
             f"{job.tokens_per_second:.1f} tok/s")
    if job.error:
        text += f"; error: {job.error}"
    return text


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    job = client.get_job(args.job)
    print(f"{PROG}: {describe_job(job)}", file=sys.stderr)
    _print_job(job, sys.stdout)
    return EXIT_OK


def cmd_list(client: Client, args: argparse.Namespace) -> int:
    jobs = client.list_jobs(state=args.state, page_size=args.page_size, limit=args.limit)
    out = sys.stdout
    if args.json:
        for job in jobs:
            out.write(json.dumps(job_to_dict(job), ensure_ascii=False) + "\n")
        return EXIT_OK
    rows = [("ID", "STATE", "DONE/TOTAL", "FAILED", "CREATED")]
    for job in jobs:
        c = job.request_counts
        rows.append((job.id, state_name(job.state), f"{c.completed + c.failed}/{c.total}",
                     str(c.failed), _timestamp(job.created_at)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
    return EXIT_OK


def _write_results(client: Client, job_id: str, wait: bool, out: TextIO) -> int:
    count, previous = 0, -1
    for result in client.result_messages(job_id, wait=wait):
        if result.index <= previous:
            raise ClientError(
                grpc.StatusCode.INTERNAL,
                f"results of {job_id} out of order: index {result.index} after {previous}")
        previous = result.index
        out.write(result.line.rstrip("\n") + "\n")
        count += 1
    return count


def cmd_results(client: Client, args: argparse.Namespace) -> int:
    wait = not args.no_wait
    if args.output == "-":
        count = _write_results(client, args.job, wait, sys.stdout)
        sys.stdout.flush()
        print(f"{PROG}: {count} results", file=sys.stderr)
        return EXIT_OK
    target = os.path.abspath(args.output)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write {args.output}: no directory {directory}")
    # Written to a temporary file beside the target, renamed when complete.
    with atomic_file(target, "w") as out:
        count = _write_results(client, args.job, wait, out)
    print(f"{PROG}: wrote {count} results to {args.output}", file=sys.stderr)
    return EXIT_OK


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    _print_job(client.cancel(args.job), sys.stdout)
    return EXIT_OK


def cmd_delete(client: Client, args: argparse.Namespace) -> int:
    client.delete_job(args.job)
    print(f"deleted {args.job}", file=sys.stderr)
    return EXIT_OK


def cmd_shard(args: argparse.Namespace) -> int:
    if getattr(args, "server", None) is not None:
        raise UsageError("shard takes --servers HOST:PORT,HOST:PORT,..., not --server")
    from .ray_driver import RAY_HINT, RAY_SERVERS, ShardRunError, parse_servers, run

    try:  # usage errors first, then a missing Ray
        if args.servers != RAY_SERVERS:
            parse_servers(args.servers)
        with open(args.file, "rb"):
            pass
    except ValueError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot read {args.file}: {e.strerror or e}") from None
    try:
        importlib.import_module("ray")  # fail early with a hint; run() uses it
    except ImportError:
        raise UsageError(f"`moebatch shard` runs on Ray, which is not installed: {RAY_HINT}"
                         ) from None
    try:
        summary = run(args.file, args.servers, args.output, errors=args.errors,
                      work_dir=args.work_dir, token=getattr(args, "token", None),
                      tls_ca=getattr(args, "tls_ca", None),
                      tls_cert=getattr(args, "tls_cert", None),
                      tls_key=getattr(args, "tls_key", None),
                      shard_requests=args.shard_requests, shard_tokens=args.shard_tokens,
                      in_flight=args.in_flight, lost_after=args.lost_after,
                      poll_interval=args.poll_interval,
                      timeout=getattr(args, "timeout", SHARD_TIMEOUT),
                      max_attempts=args.max_attempts, ray_address=args.ray_address,
                      progress=None if args.no_progress else sys.stderr,
                      interval=args.interval)
    except ShardRunError as e:
        raise JobEndedBadly(f"shard: {e}") from None
    except KeyboardInterrupt:
        print(f"{PROG}: shard: stopped; the jobs on the daemons go on, and the same command "
              "resumes", file=sys.stderr)
        raise
    print(f"{PROG}: shard: {summary.describe()}", file=sys.stderr)
    for shard, why in sorted(summary.failed_shards.items()):
        print(f"{PROG}: shard: {shard} failed: {why}", file=sys.stderr)
    if not summary.ok:
        if summary.missing:
            print(f"{PROG}: shard: {summary.missing} custom_ids have no line; rerun the same "
                  f"command", file=sys.stderr)
        return EXIT_SERVER
    return EXIT_OK


def cmd_ray_daemons(args: argparse.Namespace) -> int:
    if getattr(args, "server", None) is not None:
        raise UsageError("ray-daemons takes no --server")
    if args.action != "start" and args.daemon_args:
        raise UsageError(f"ray-daemons {args.action} takes no moebatchd arguments")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port: must be in [0, 65535], got {args.port}")
    from .ray_driver import RAY_HINT, _ray_init, _ray_shutdown

    try:
        importlib.import_module("ray")
    except ImportError:
        raise UsageError(f"`moebatch ray-daemons` runs on Ray, which is not installed: "
                         f"{RAY_HINT}") from None
    from . import ray_daemons

    started = _ray_init(args.ray_address)
    try:
        if args.action == "start":
            try:
                daemons = ray_daemons.start(
                    args.daemon_args, moebatchd=args.moebatchd, gpus=args.gpus, port=args.port,
                    data_dir=args.data_dir, min_nodes=args.min_nodes, wait=args.wait,
                    ready_timeout=args.wait)
            except ValueError as e:
                raise UsageError(f"ray-daemons start: {e}") from None
            except ray_daemons.DaemonGroupError as e:
                raise JobEndedBadly(f"ray-daemons start: {e}") from None
            print(",".join(d.address for d in daemons))
            print(f"{PROG}: ray-daemons: {len(daemons)} daemons serve; run `moebatch shard FILE "
                  "--servers ray -o OUT`", file=sys.stderr)
        elif args.action == "list":
            for d in ray_daemons.list_daemons():
                state = f"pid {d.pid}" if d.pid else "down"
                print(f"{d.address}\t{d.name}\tnode {d.node_id[:12]}\t{state}\t"
                      f"{d.restarts} restarts")
        else:
            stopped = ray_daemons.stop(grace=args.grace)
            print(f"{PROG}: ray-daemons: stopped {len(stopped)} daemons"
                  + (f" ({', '.join(stopped)})" if stopped else ""), file=sys.stderr)
    finally:
        _ray_shutdown(started)
    return EXIT_OK


# -- entry point ------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses the command line; `ray-daemons ... -- ARGS` keeps ARGS for moebatchd."""
    argv = list(sys.argv[1:] if argv is None else argv)
    daemon_args = None
    if "ray-daemons" in argv and "--" in argv[argv.index("ray-daemons"):]:
        cut = argv.index("--", argv.index("ray-daemons"))
        argv, daemon_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    if daemon_args is not None:
        args.daemon_args = daemon_args
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse: 2 for bad usage, 0 for --help / --version
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    server = getattr(args, "server", None) or default_server()
    timeout = getattr(args, "timeout", DEFAULT_TIMEOUT)
    try:
        if getattr(args, "no_client", False):
            return args.func(args)
        with Client(server, timeout=timeout, token=getattr(args, "token", None),
                    tls_ca=getattr(args, "tls_ca", None), tls_cert=getattr(args, "tls_cert", None),
                    tls_key=getattr(args, "tls_key", None)) as client:
            return args.func(client, args)
    except ValueError as e:  # unreadable PEM files, a cert without its key
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ClientError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_SERVER
    except JobEndedBadly as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_SERVER
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `moebatch results JOB | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
