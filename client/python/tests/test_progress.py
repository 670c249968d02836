"""The progress bar, `moebatch watch` and `moebatch status` (against the fake daemon of
conftest.py): the bar counts tokens as well as requests, and the figures shown are the daemon's."""
from __future__ import annotations

import datetime as dt
import io
import json

import pytest

from moebatch import cli
from moebatch.jobs import job_to_dict, progress_to_dict
from moebatch.v1 import batch_pb2 as pb

RUNNING = pb.JOB_STATE_IN_PROGRESS


def progress(done=0, total=8, generated=0, max_tokens=0, state=RUNNING, **kw) -> pb.JobProgress:
    return pb.JobProgress(job_id="job_t", state=state,
                          request_counts=pb.RequestCounts(total=total, completed=done),
                          generated_tokens=generated, max_tokens_total=max_tokens, **kw)


@pytest.mark.parametrize("p, fraction", [
    # Continuous batching: no request done yet, a quarter of the tokens generated.
    (progress(0, 8, 512, 2048), 0.25),
    # Requests that stopped early (EOS): the request fraction leads.
    (progress(6, 8, 100, 2048), 0.75),
    (progress(2, 8, 0, 0), 0.25),  # no token total known (a job from before a restart)
    (progress(0, 0), 0.0),
    (progress(0, 8, 5000, 2048), 1.0),  # clamped
    (progress(8, 8, 100, 2048, state=pb.JOB_STATE_COMPLETED), 1.0),
    (progress(2, 8, 100, 2048, state=pb.JOB_STATE_CANCELLED), 0.25),
])
def test_progress_fraction(p, fraction):
    assert cli.progress_fraction(p) == fraction


def test_describe_progress():
    p = pb.JobProgress(state=RUNNING, request_counts=pb.RequestCounts(total=805, completed=118,
                                                                      failed=2),
                       generated_tokens=70000, max_tokens_total=206080, elapsed_seconds=61.6,
                       tokens_per_second=1234.54, eta_seconds=42)
    assert cli.describe_progress(p) == (
        "in_progress 120/805 done (2 failed), 70000/206080 tokens, 34%, 1234.5 tok/s, "
        "1:02 elapsed, ETA 0:42")
    assert cli.describe_progress(progress(1, 4, 17)) == (
        "in_progress 1/4 done (0 failed), 17 tokens, 25%, 0.0 tok/s, 0:00 elapsed, ETA ?")


def test_the_bar_moves_with_tokens_before_any_request_is_done():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    display = cli.ProgressDisplay("job_t", stream)
    display.update(progress(0, 8, 0, 2048))
    assert display.bar.n == 0
    display.update(progress(0, 8, 1024, 2048, tokens_per_second=312.5, elapsed_seconds=3.3,
                            eta_seconds=3.3))
    assert display.bar.n == 500  # half the tokens: half the bar, with no request done
    display.close()
    text = stream.getvalue()
    assert " 50%|" in text
    assert "0/8 req (0 failed), 1024/2048 tok, 312.5 tok/s, 0:03, ETA 0:03" in text


def test_progress_to_dict_has_the_new_fields():
    d = progress_to_dict(progress(1, 8, 40, 64, elapsed_seconds=0.75, tokens_per_second=53.3))
    assert d["max_tokens_total"] == 64 and d["elapsed_seconds"] == 0.75
    assert d["generated_tokens"] == 40 and d["tokens_per_second"] == 53.3


def test_describe_job_local_times():
    started = dt.datetime(2026, 11, 27, 14, 3, 9).astimezone()
    zone = started.strftime("%Z")
    t = int(started.timestamp())
    job = pb.Job(id="job_1", state=pb.JOB_STATE_COMPLETED,
                 request_counts=pb.RequestCounts(total=805, completed=803, failed=2),
                 created_at=t - 5, started_at=t, finished_at=t + 10, prompt_tokens=9630,
                 generated_tokens=15360, tokens_per_second=1626.93, elapsed_seconds=9.441)
    assert cli.describe_job(job) == (
        f"job_1 completed: 805/805 done (2 failed); started 2026-11-27 14:03:09 {zone}, "
        f"ran 9.44s, finished 2026-11-27 14:03:19 {zone}; 9630 prompt tokens, 15360 generated "
        "tokens, 1626.9 tok/s")
    queued = pb.Job(id="job_2", state=RUNNING, request_counts=pb.RequestCounts(total=3),
                    created_at=t)
    assert cli.describe_job(queued) == (
        f"job_2 in_progress: 0/3 done (0 failed); not started (created 2026-11-27 14:03:09 "
        f"{zone}); 0 prompt tokens, 0 generated tokens, 0.0 tok/s")
    assert cli.describe_job(pb.Job(id="j", state=pb.JOB_STATE_FAILED, error="boom")).endswith(
        "; error: boom")


def test_job_start_is_the_job_clocks():
    job = pb.Job(created_at=100, started_at=109, finished_at=110, elapsed_seconds=9.4)
    assert cli.job_start(job) == 100  # 110 - 9.4, not the first result's 109
    running = pb.Job(created_at=100, started_at=130, elapsed_seconds=25.5)
    assert cli.job_start(running, now=140.0) == 114
    assert cli.job_start(pb.Job(created_at=100, finished_at=101, elapsed_seconds=3)) == 100
    # No clock (a job finished before the daemon started, whole seconds 0): the store's.
    assert cli.job_start(pb.Job(created_at=100, started_at=105, finished_at=105)) == 105
    assert cli.job_start(pb.Job(created_at=100)) == 0


def test_job_to_dict_has_the_daemons_figures():
    d = job_to_dict(pb.Job(id="j", started_at=101, prompt_tokens=30, generated_tokens=12,
                           tokens_per_second=4.8, elapsed_seconds=2.5))
    assert {k: d[k] for k in ("started_at", "prompt_tokens", "generated_tokens",
                              "tokens_per_second", "elapsed_seconds")} == {
        "started_at": 101, "prompt_tokens": 30, "generated_tokens": 12,
        "tokens_per_second": 4.8, "elapsed_seconds": 2.5}


def test_watch_a_job_submitted_elsewhere(fake_server, capsys):
    address, service = fake_server
    service.add_job("job_other", total=3)
    assert cli.main(["--server", address, "watch", "job_other"]) == 0
    out, err = capsys.readouterr()
    job = json.loads(out)
    assert job["id"] == "job_other" and job["state"] == "completed"
    assert job["generated_tokens"] == 12 and job["tokens_per_second"] == 123.5
    lines = err.splitlines()
    assert lines[0] == "moebatch: watching job_other (3 requests)"
    # Tokens move before requests finish: 6 of 12 at 0/3 requests.
    assert ("moebatch: job_other in_progress 0/3 done (0 failed), 6/12 tokens, 50%, 0.0 tok/s, "
            "0:00 elapsed, ETA 0:03") in lines
    assert lines[-1].startswith(
        "moebatch: job_other completed: 3 completed, 0 failed of 3 requests in 0.10s; "
        "30 prompt tokens, 12 generated tokens, 123.5 tok/s")
    assert "since submission" not in err


def test_watch_a_finished_job_prints_it_at_once(fake_server, capsys):
    address, service = fake_server
    service.add_job("job_done", total=3)
    assert cli.main(["--server", address, "watch", "job_done", "--no-progress"]) == 0
    capsys.readouterr()
    watches = sum(1 for name, _ in service.calls if name == "WatchJob")
    assert cli.main(["--server", address, "watch", "job_done"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["state"] == "completed"
    assert "watching" not in err and "in_progress" not in err
    assert err.splitlines() == [
        "moebatch: job_done completed 3/3 done (0 failed), 12/12 tokens, 100%, 123.5 tok/s, "
        "0:00 elapsed, ETA ?",
        "moebatch: job_done completed: 3 completed, 0 failed of 3 requests in 0.10s; "
        "30 prompt tokens, 12 generated tokens, 123.5 tok/s"]
    assert sum(1 for name, _ in service.calls if name == "WatchJob") == watches + 1


@pytest.mark.parametrize("state, code, message", [
    (pb.JOB_STATE_CANCELLED, 1, "moebatch: job job_x was cancelled\n"),
    (pb.JOB_STATE_FAILED, 1, "moebatch: job job_x failed: no reason given\n"),
])
def test_watch_exit_code_follows_the_jobs_end(fake_server, capsys, state, code, message):
    address, service = fake_server
    service.add_job("job_x", state=state)
    assert cli.main(["--server", address, "watch", "job_x"]) == code
    out, err = capsys.readouterr()
    assert err.endswith(message)
    assert json.loads(out)["id"] == "job_x"


def test_watch_unknown_job(fake_server, capsys):
    address, _ = fake_server
    assert cli.main(["--server", address, "watch", "job_nope"]) == 1
    assert capsys.readouterr().err == "moebatch: NOT_FOUND: job job_nope not found\n"


def test_status_summary_on_stderr(fake_server, capsys):
    address, service = fake_server
    service.add_job("job_s", total=2)
    assert cli.main(["--server", address, "watch", "job_s", "--no-progress"]) == 0
    capsys.readouterr()
    assert cli.main(["--server", address, "status", "job_s"]) == 0
    out, err = capsys.readouterr()
    job = json.loads(out)
    assert job["started_at"] == 1_700_000_001 and job["generated_tokens"] == 8
    # The start from the job clock: finished_at less elapsed_seconds (0.06 s).
    started = cli._timestamp(1_700_000_009, zone=True)
    assert err == (f"moebatch: job_s completed: 2/2 done (0 failed); started {started}, "
                   f"ran 0.06s, finished {cli._timestamp(1_700_000_010, zone=True)}; "
                   "20 prompt tokens, 8 generated tokens, 123.5 tok/s\n")
    # Local time, human readable.
    local = dt.datetime.fromtimestamp(1_700_000_009).strftime("%Y-%m-%d %H:%M:%S")
    assert started.startswith(local)


def test_watch_arguments():
    parse = cli.build_parser().parse_args
    args = parse(["watch", "job_1", "--interval", "0.2", "--no-progress"])
    assert (args.job, args.interval, args.no_progress) == ("job_1", 0.2, True)
    assert parse(["watch", "job_1"]).interval == 5.0
    assert parse(["submit", "f.jsonl", "--wait", "--interval", "1"]).interval == 1.0
    assert cli.main(["watch"]) == 2
    assert cli.main(["watch", "job_1", "--interval", "0"]) == 2
