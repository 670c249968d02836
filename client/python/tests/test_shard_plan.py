"""moebatch.shard_plan: the multi-daemon driver's decisions without Ray or a daemon: the run id,
which job a shard adopts, the state file, where shards go (and come back from a lost daemon),
and the run's progress figures. Also the CLI's `shard` usage errors and its message without Ray."""
import json
import sys

import pytest

from moebatch import cli
from moebatch.ray_driver import parse_servers
from moebatch.shard_plan import (PART_KEY, RUN_KEY, SHARD_KEY, SHARD_SHA_KEY, JobInfo, Planner,
                                 RunProgress, RunState, ServerFigures, choose_job, job_info,
                                 job_metadata, run_id)
from moebatch.v1 import batch_pb2 as pb

SHARDS = [f"shard-{i:05d}" for i in range(10)]
A, B, C = "a:1", "b:1", "c:1"


def job(id, state=pb.JOB_STATE_IN_PROGRESS, sha="s", created=100, shard="shard-00000"):
    return JobInfo(id=id, shard=shard, shard_sha256=sha, state=state, created_at=created)


# -- run id, metadata, adoption ---------------------------------------------------------------

def test_run_id_is_the_input_and_the_output(tmp_path):
    rid = run_id("ab" * 32, tmp_path / "out.jsonl")
    assert len(rid) == 24 and rid == run_id("ab" * 32, str(tmp_path / "out.jsonl"))
    assert rid != run_id("ab" * 32, tmp_path / "other.jsonl")
    assert rid != run_id("cd" * 32, tmp_path / "out.jsonl")
    assert job_metadata(rid, "shard-00003", "f00") == {
        RUN_KEY: rid, SHARD_KEY: "shard-00003", SHARD_SHA_KEY: "f00"}


def test_job_info_keeps_only_this_runs_jobs():
    mine = pb.Job(id="job_1", state=pb.JOB_STATE_COMPLETED, created_at=5,
                  metadata=job_metadata("run1", "shard-00002", "sha"))
    assert job_info(mine, "run1") == JobInfo("job_1", "shard-00002", "sha",
                                             pb.JOB_STATE_COMPLETED, 5)
    assert job_info(mine, "run2") is None
    assert job_info(pb.Job(id="job_2", metadata={"team": "x"}), "run1") is None
    assert job_info(pb.Job(id="job_3", metadata={RUN_KEY: "run1"}), "run1") is None


def test_choose_job_prefers_completed_then_newest_and_skips_unusable():
    jobs = [job("old", created=1), job("new", created=2)]
    assert choose_job(jobs, "s").id == "new"
    assert choose_job(jobs + [job("done", pb.JOB_STATE_COMPLETED, created=0)], "s").id == "done"
    # Another shard content (a different split): never adopted.
    assert choose_job([job("x", sha="other")], "s") is None
    for state in (pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED, pb.JOB_STATE_CANCELLING,
                  pb.JOB_STATE_EXPIRED):
        assert choose_job([job("bad", state)], "s") is None
    assert choose_job(jobs, "s", unusable={"new"}).id == "old"
    assert choose_job([], "s") is None
    # A job holding part of the shard (the daemon refused the whole) is adopted for that part.
    part = JobInfo("half", "shard-00000", "s", pb.JOB_STATE_COMPLETED, 3, part_sha256="p1")
    assert choose_job([part], "s") is None
    assert choose_job([part, job("whole")], "s", part_sha256="p1").id == "half"
    assert choose_job([part], "s", part_sha256="p2") is None
    assert job_info(pb.Job(id="half", state=pb.JOB_STATE_COMPLETED, created_at=3,
                           metadata=job_metadata("r", "shard-00000", "s", "p1")), "r") == part
    assert PART_KEY not in job_metadata("r", "shard-00000", "s")


# -- state file -------------------------------------------------------------------------------

def test_state_file_round_trip(tmp_path):
    assert RunState.load(tmp_path) is None
    state = RunState(run_id="r", source="in.jsonl", source_sha256="s", output="out.jsonl",
                     errors="out.errors.jsonl", servers=[A, B], sessions=1)
    state.shards["shard-00000"] = {"server": A, "job": "job_1", "state": "done"}
    state.lost[B] = 123.0
    state.save(tmp_path)
    again = RunState.load(tmp_path)
    assert again == state and again.updated_at > 0
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left
    (tmp_path / "state.json").write_text(json.dumps({"run_id": "r", "bogus": 1}))
    with pytest.raises(ValueError, match="not a moebatch state file"):
        RunState.load(tmp_path)


# -- planner ----------------------------------------------------------------------------------

def assigned(pairs):
    out = {}
    for server, shard in pairs:
        out.setdefault(server, []).append(shard)
    return out


def test_assign_fills_every_daemon_round_robin_in_input_order():
    p = Planner(SHARDS, [A, B, C], in_flight=2)
    first = p.assign()
    assert [s for _, s in first] == SHARDS[:6]
    assert assigned(first) == {A: [SHARDS[0], SHARDS[3]], B: [SHARDS[1], SHARDS[4]],
                               C: [SHARDS[2], SHARDS[5]]}
    assert p.assign() == []  # every daemon is full
    assert p.finish(SHARDS[1], B) == []
    assert p.assign() == [(B, SHARDS[6])]
    for shard, server in list(p.running.items()):
        p.finish(shard, server)
    while not p.complete:
        for server, shard in p.assign():
            p.finish(shard, server)
    assert p.done == set(SHARDS) and not p.failed and p.pending == []


def test_a_daemon_adopts_the_shards_it_holds_and_others_leave_them():
    p = Planner(SHARDS, [A, B], in_flight=1, done=[SHARDS[0]])
    p.note_jobs(B, [SHARDS[7], SHARDS[0], "shard-99999"])  # done and unknown shards ignored
    assert p.holders == {SHARDS[7]: {B}}
    assert p.assign() == [(A, SHARDS[1]), (B, SHARDS[7])]
    p.finish(SHARDS[1], A)
    assert p.assign() == [(A, SHARDS[2])]


def test_a_lost_daemons_shards_move_and_its_surplus_jobs_are_named():
    p = Planner(SHARDS[:6], [A, B], in_flight=2)
    p.assign()
    assert p.in_flight[A] == {SHARDS[0], SHARDS[2]}
    assert p.lose(A) == [SHARDS[0], SHARDS[2]] and p.lose(A) == []
    assert p.moved == 2 and p.usable_servers == [B]
    assert p.pending == [SHARDS[0], SHARDS[2], SHARDS[4], SHARDS[5]]
    # B finishes one; the freed slot takes the first pending shard, A's held ones included.
    p.finish(SHARDS[1], B)
    assert p.assign() == [(B, SHARDS[0])]
    # Done on B while A (lost) may still run it: A's job is surplus.
    assert p.finish(SHARDS[0], B) == [A]
    assert p.assign() == [(B, SHARDS[2])]
    # A answers again with jobs for shards 0 (done: surplus), 2 (running on B) and 4 (pending).
    assert p.revive(A, [SHARDS[0], SHARDS[2], SHARDS[4]]) == [SHARDS[0]]
    assert p.assign() == [(A, SHARDS[4]), (A, SHARDS[5])]
    assert p.finish(SHARDS[2], B) == [A]  # A's job for shard 2 is surplus now


def test_jobs_that_end_badly_are_retried_elsewhere_then_fail():
    p = Planner(SHARDS[:1], [A, B], in_flight=1, max_attempts=2)
    assert p.assign() == [(A, SHARDS[0])]
    assert not p.job_ended(SHARDS[0], A, "job_1 failed: boom")
    assert p.holders[SHARDS[0]] == set()  # A's job is not adopted again
    assert p.assign() == [(A, SHARDS[0])]
    assert p.job_ended(SHARDS[0], A, "job_2 cancelled: cancelled")
    assert p.failed == {SHARDS[0]: "2 jobs ended badly, the last on a:1: job_2 cancelled: "
                                   "cancelled"}
    assert p.complete and p.assign() == []


def test_a_busy_daemon_gets_fewer_shards():
    p = Planner(SHARDS[:4], [A], in_flight=3)
    p.assign()
    assert not p.busy(A, SHARDS[2], "RESOURCE_EXHAUSTED: too many pending jobs")
    assert p.cap[A] == 2 and p.pending == [SHARDS[2], SHARDS[3]]
    assert p.assign() == []
    p.finish(SHARDS[0], A)
    p.finish(SHARDS[1], A)
    assert p.assign() == [(A, SHARDS[2]), (A, SHARDS[3])]
    # Alone and still refused: it counts as an attempt.
    p.finish(SHARDS[3], A)
    assert not p.busy(A, SHARDS[2], "RESOURCE_EXHAUSTED: message too large")
    assert p.attempts[SHARDS[2]] == 1


def test_excluded_and_failed_shards():
    p = Planner(SHARDS[:3], [A, B], in_flight=1)
    p.assign()
    assert p.exclude(A, "UNAUTHENTICATED: bad token") == [SHARDS[0]]
    assert p.usable_servers == [B]
    p.finish(SHARDS[1], B)
    assert p.assign() == [(B, SHARDS[0])]
    p.fail(SHARDS[0], "b:1 refused it: INVALID_ARGUMENT: line 3: body.max_tokens")
    assert p.assign() == [(B, SHARDS[2])]
    assert p.finish(SHARDS[0], B) == [] and SHARDS[0] in p.done  # a late result still counts
    assert SHARDS[0] not in p.failed
    with pytest.raises(ValueError):
        Planner(SHARDS, [A, A], in_flight=1)
    with pytest.raises(ValueError):
        Planner(SHARDS, [], in_flight=1)


# -- progress ---------------------------------------------------------------------------------

def test_progress_rates_eta_and_lines():
    progress = RunProgress(total_requests=1000, window=10)
    progress.update({A: ServerFigures(), B: ServerFigures()}, base_requests=100, now=0)
    assert progress.done == 100 and progress.tokens_per_second() == 0
    assert progress.eta_seconds() is None
    progress.update({A: ServerFigures(requests=200, tokens=400, in_flight=2),
                     B: ServerFigures(requests=100, failed=3, tokens=200, in_flight=1,
                                      status="unreachable 3s")},
                    base_requests=100, now=2)
    assert progress.done == 400 and progress.failed == 3
    assert progress.tokens_per_second() == 300 and progress.tokens_per_second(A) == 200
    assert progress.requests_per_second() == 150 and progress.eta_seconds() == 4
    assert progress.describe() == ("400/1000 requests (40%), 3 failed, 300.0 tok/s, ETA 0:04, "
                                   "2 daemons (1 not ok)")
    assert progress.describe_server(B) == ("b:1: 100 requests, 1 shards in flight, 100.0 tok/s, "
                                           "unreachable 3s")
    # A lost daemon's running shards are taken away: figures drop, rates never go negative.
    progress.update({A: ServerFigures(requests=200, tokens=400), B: ServerFigures()},
                    base_requests=100, now=20)
    assert progress.tokens_per_second(B) == 0 and progress.requests_per_second() == 0
    progress.update({A: ServerFigures(requests=900)}, base_requests=100, now=21)
    assert progress.done == 1000 and progress.eta_seconds() == 0


# -- the CLI ----------------------------------------------------------------------------------

def test_parse_servers():
    assert parse_servers("a:1, b:2,") == ["a:1", "b:2"]
    assert parse_servers(["[::1]:5"]) == ["[::1]:5"]
    for bad, message in [("", "no daemon"), (",", "no daemon"), ("a", "not HOST:PORT"),
                         ("a:x", "not HOST:PORT"), (":1", "not HOST:PORT"),
                         ("a:1,a:1", "named twice"), ("a:70000", "not HOST:PORT")]:
        with pytest.raises(ValueError, match=message):
            parse_servers(bad)


def test_shard_arguments():
    args = cli.build_parser().parse_args(["shard", "in.jsonl", "--servers", "a:1,b:2", "-o",
                                          "out.jsonl", "--lost-after", "10", "--in-flight", "4"])
    assert args.func is cli.cmd_shard and args.no_client
    assert (args.servers, args.output, args.lost_after, args.in_flight) == (
        "a:1,b:2", "out.jsonl", 10.0, 4)
    assert (args.shard_requests, args.shard_tokens, args.max_attempts) == (1000, 1_000_000, 3)
    assert args.errors is None and args.work_dir is None and args.ray_address is None


@pytest.mark.parametrize("argv, message", [
    (["shard", "IN", "--servers", "", "-o", "out.jsonl"], "no daemon given"),
    (["shard", "IN", "--servers", "a:1,a:1", "-o", "out.jsonl"], "named twice"),
    (["shard", "/nonexistent.jsonl", "--servers", "a:1", "-o", "out.jsonl"], "cannot read"),
    (["--server", "a:1", "shard", "IN", "--servers", "a:1", "-o", "out.jsonl"],
     "not --server"),
])
def test_shard_usage_errors(argv, message, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text("{}\n")
    argv = [str(source) if a == "IN" else a for a in argv]
    assert cli.main(argv) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_shard_without_ray_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    source = tmp_path / "in.jsonl"
    source.write_text("{}\n")
    assert cli.main(["shard", str(source), "--servers", "a:1", "-o",
                     str(tmp_path / "out.jsonl")]) == cli.EXIT_USAGE
    assert "pip install 'moebatch[ray]'" in capsys.readouterr().err
