"""`moebatch shard` (moebatch.ray_driver) end to end: a Ray cluster of three nodes on this machine
(ray.cluster_utils.Cluster), three real moebatchd daemons with the tiny model, a 3,000-request
file in 30 shards. Every custom_id exactly once in the output:
  (a) a plain run through the Python API, each shard submitted exactly once;
  (b) one daemon killed with kill -9 in the middle and not restarted: its shards move;
  (c) the driver (`python -m moebatch shard`) killed with kill -9 in the middle and rerun:
      finished shards are not run again, shards in flight are adopted (one job per shard);
  (d) a daemon killed and restarted within the grace period: it resumes its own jobs, nothing
      moves and nothing is submitted twice;
  (e) a daemon lost, then back: its shards moved, it is used again afterwards;
  (f) every daemon lost: the run stops (ShardRunError); rerun once they are back, it finishes;
  and lines the daemon refuses fail alone (their shard runs in halves), and a run against daemons
  that are all unreachable fails at once, naming them.

Everything on loopback: Ray listens on 127.0.0.1 because RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
makes Ray take the loopback address as its node address (else it picks the host's outward
address), set before Ray is imported and passed on to the driver subprocess. Skipped without Ray
(`pip install 'moebatch[ray]'`).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest  # noqa: E402

ray = pytest.importorskip("ray")

from conftest import Daemon, free_port  # noqa: E402
from moebatch import Client  # noqa: E402
from moebatch.shard import Manifest  # noqa: E402
from moebatch.shard_plan import RUN_KEY, SHARD_KEY  # noqa: E402

N_REQUESTS = 3000
SHARD_REQUESTS = 100   # 30 shards
SMALL_REQUESTS, SMALL_SHARD_REQUESTS = 1200, 40
RUN_TIMEOUT = 240      # seconds for one driver run (~20 s on an idle 2-core machine)
DRIVER_ARGS = ["--shard-requests", str(SHARD_REQUESTS), "--in-flight", "2", "--lost-after", "5",
               "--poll-interval", "0.2", "--interval", "5"]


@pytest.fixture(scope="module")
def ray_cluster():
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": 80 << 20, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True,
                      head_node_args={**node, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    yield cluster.address
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def daemons(tmp_path):
    started = []
    try:
        for i in range(3):
            started.append(Daemon(tmp_path / f"daemon-{i}").start())
        yield started
    finally:
        for d in started:
            d.stop()


def write_batch(path, n):
    """n short greedy requests, chat and completions, max_tokens 4-8; one invalid line (after
    request 1234, or the last one)."""
    with open(path, "w") as f:
        for i in range(n):
            body = {"max_tokens": 4 + i % 5, "temperature": 0}
            if i % 2:
                url, body["messages"] = "/v1/chat/completions", [
                    {"role": "user", "content": f"Count to {i % 17}."}]
            else:
                url, body["prompt"] = "/v1/completions", f"Request {i}: the quick brown fox"
            f.write(json.dumps({"custom_id": f"req-{i:05d}", "method": "POST", "url": url,
                                "body": body}) + "\n")
            if i == min(1234, n - 1):
                f.write("{this line is not JSON\n")
    return path


@pytest.fixture(scope="module")
def batch_file(tmp_path_factory):
    """The 3,000-request file (30 shards of SHARD_REQUESTS)."""
    return write_batch(tmp_path_factory.mktemp("input") / "batch.jsonl", N_REQUESTS)


@pytest.fixture(scope="module")
def small_batch_file(tmp_path_factory):
    """1,200 requests: 30 shards of SMALL_SHARD_REQUESTS, for the daemon restart case."""
    return write_batch(tmp_path_factory.mktemp("input") / "small.jsonl", SMALL_REQUESTS)


def expected_ids(n=N_REQUESTS):
    return [f"req-{i:05d}" for i in range(n)]


def ids_in(path):
    with open(path) as f:
        return [json.loads(line)["custom_id"] for line in f]


def assert_exactly_once(output, errors, n=N_REQUESTS):
    results, failures = ids_in(output), ids_in(errors)
    # The results follow the input's order; the one invalid line is the only error.
    assert results == expected_ids(n)
    assert failures == [None]
    with open(errors) as f:
        line = 1236 if n > 1234 else n + 1
        assert f"line {line}: invalid JSON" in json.loads(f.readline())["error"]["message"]
    with open(output) as f:
        for line in f:
            result = json.loads(line)
            assert result["error"] is None and result["response"]["status_code"] == 200


def jobs_per_shard(daemons, run=None):
    """Counter of shard name -> jobs for it on the daemons that are running (this run's)."""
    count = Counter()
    for d in daemons:
        if d.proc.poll() is not None:
            continue
        with Client(d.addr, timeout=30) as c:
            for job in c.list_jobs(page_size=1000):
                if RUN_KEY in job.metadata and (run is None or job.metadata[RUN_KEY] == run):
                    count[job.metadata[SHARD_KEY]] += 1
    return count


def shard_names(work_dir):
    return [s.name for s in Manifest.load(work_dir / "input").shards]


def run_in_thread(**kwargs):
    """moebatch.ray_driver.run in a thread, bounded: (summary, error)."""
    from moebatch.ray_driver import run

    box = {}

    def target():
        try:
            box["summary"] = run(**kwargs)
        except BaseException as e:  # handed to the test
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def finish(thread, box):
    thread.join(RUN_TIMEOUT)
    assert not thread.is_alive(), f"the driver did not finish within {RUN_TIMEOUT} s"
    if "error" in box:
        raise box["error"]
    return box["summary"]


def results_written(work_dir):
    directory = work_dir / "results"
    return sorted(p.name for p in directory.glob("shard-*.jsonl")) if directory.exists() else []


def wait_for_results(work_dir, n, timeout=RUN_TIMEOUT, stop=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(results_written(work_dir)) >= n:
            return
        if stop is not None and stop():
            raise AssertionError("the driver ended before the moment to interrupt it")
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} shards done within {timeout} s")


def test_every_custom_id_once_across_three_daemons(ray_cluster, daemons, batch_file, tmp_path):
    output, work = tmp_path / "out.jsonl", tmp_path / "work"
    started = time.monotonic()
    summary = finish(*run_in_thread(
        source=batch_file, servers=[d.addr for d in daemons], output=output, work_dir=work,
        shard_requests=SHARD_REQUESTS, in_flight=2, lost_after=5, poll_interval=0.2,
        ray_address=ray_cluster, progress=sys.stderr, interval=5))
    print(f"plain run: {time.monotonic() - started:.1f} s; {summary.describe()}")
    assert summary.ok and summary.missing == 0 and summary.duplicates == 0
    assert (summary.completed, summary.failed, summary.left_out) == (N_REQUESTS, 1, 1)
    assert summary.shards == summary.shards_run == 30 and summary.shards_adopted == 0
    assert summary.lost == [] and summary.tokens > 0
    assert_exactly_once(output, tmp_path / "out.errors.jsonl")
    # Each shard was submitted exactly once, and every daemon had a share.
    per_shard = jobs_per_shard(daemons, summary.run_id)
    assert per_shard == Counter({name: 1 for name in shard_names(work)})
    for d in daemons:
        assert jobs_per_shard([d], summary.run_id), f"{d.addr} got no shard"
    state = json.loads((work / "state.json").read_text())
    assert state["finished"] and state["sessions"] == 1 and state["run_id"] == summary.run_id
    assert {v["state"] for v in state["shards"].values()} == {"done"}

    # Run again: everything is done, nothing is submitted, the same output.
    before = output.read_bytes()
    again = finish(*run_in_thread(
        source=batch_file, servers=[d.addr for d in daemons], output=output, work_dir=work,
        shard_requests=SHARD_REQUESTS, ray_address=ray_cluster, progress=None))
    assert again.ok and again.shards_run == 0 and output.read_bytes() == before
    assert jobs_per_shard(daemons, summary.run_id) == per_shard


def test_a_daemon_killed_mid_run_loses_nothing(ray_cluster, daemons, batch_file, tmp_path):
    output, work = tmp_path / "out.jsonl", tmp_path / "work"
    victim = daemons[1]
    started = time.monotonic()
    thread, box = run_in_thread(
        source=batch_file, servers=[d.addr for d in daemons], output=output, work_dir=work,
        shard_requests=SHARD_REQUESTS, in_flight=2, lost_after=5, poll_interval=0.2,
        ray_address=ray_cluster, progress=sys.stderr, interval=5)
    # Kill once a few shards are done: the victim has shards in flight then.
    wait_for_results(work, 6, stop=lambda: not thread.is_alive())
    victim.kill9()
    killed_at = len(results_written(work))
    summary = finish(thread, box)
    print(f"kill run: {time.monotonic() - started:.1f} s, killed after {killed_at} shards; "
          f"{summary.describe()}")
    assert summary.ok and summary.missing == 0
    assert summary.lost == [victim.addr] and summary.moved >= 1
    assert (summary.completed, summary.failed) == (N_REQUESTS, 1)
    assert_exactly_once(output, tmp_path / "out.errors.jsonl")
    # The survivors ran every shard the victim did not finish, each once.
    state = json.loads((work / "state.json").read_text())
    on_victim = {n for n, v in state["shards"].items() if v["server"] == victim.addr}
    survivors = jobs_per_shard(daemons, summary.run_id)
    assert set(survivors) | on_victim == set(shard_names(work))
    assert all(n == 1 for n in survivors.values())


def test_the_driver_killed_and_rerun_resumes(ray_cluster, daemons, batch_file, tmp_path):
    output, work = tmp_path / "out.jsonl", tmp_path / "work"
    command = [sys.executable, "-m", "moebatch", "shard", str(batch_file),
               "--servers", ",".join(d.addr for d in daemons), "-o", str(output),
               "--work-dir", str(work), "--ray-address", ray_cluster, *DRIVER_ARGS]
    log = open(tmp_path / "driver.log", "wb")
    started = time.monotonic()
    first = subprocess.Popen(command, stdout=log, stderr=log)
    try:
        wait_for_results(work, 8, stop=lambda: first.poll() is not None)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert not output.exists()
    done_before = {name: ((work / "results" / name).stat().st_ino,
                          (work / "results" / name).stat().st_mtime_ns)
                   for name in results_written(work)}
    assert 8 <= len(done_before) < 30
    run = json.loads((work / "state.json").read_text())["run_id"]
    submitted_before = jobs_per_shard(daemons, run)
    # Shards were in flight when the driver died: jobs without a result file.
    in_flight = {n for n in submitted_before if f"{n}.jsonl" not in done_before}
    assert in_flight

    second = subprocess.run(command, stdout=log, stderr=log, timeout=RUN_TIMEOUT)
    log.close()
    print(f"driver kill run: {time.monotonic() - started:.1f} s, killed after "
          f"{len(done_before)} shards, {len(in_flight)} in flight")
    assert second.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
    assert_exactly_once(output, tmp_path / "out.errors.jsonl")
    # Finished shards were not run again: their files untouched, one job each; the shards in
    # flight were adopted, not submitted again: one job for every shard.
    for name, stat in done_before.items():
        path = work / "results" / name
        assert (path.stat().st_ino, path.stat().st_mtime_ns) == stat, name
    assert jobs_per_shard(daemons, run) == Counter({name: 1 for name in shard_names(work)})
    state = json.loads((work / "state.json").read_text())
    assert state["sessions"] == 2 and state["finished"]
    assert "30 shards (" in (tmp_path / "driver.log").read_text()


def test_a_daemon_restarted_within_the_grace_period_resumes_its_jobs(ray_cluster, daemons,
                                                                     small_batch_file, tmp_path):
    output, work = tmp_path / "out.jsonl", tmp_path / "work"
    victim = daemons[2]
    thread, box = run_in_thread(
        source=small_batch_file, servers=[d.addr for d in daemons], output=output, work_dir=work,
        shard_requests=SMALL_SHARD_REQUESTS, in_flight=2, lost_after=60, poll_interval=0.2,
        ray_address=ray_cluster, progress=sys.stderr, interval=5)
    wait_for_results(work, 6, stop=lambda: not thread.is_alive())
    victim.kill9()
    victim.start()  # the same port and data dir: its unfinished jobs run again
    summary = finish(thread, box)
    print(f"restart run: {summary.describe()}")
    assert summary.ok and summary.lost == [] and summary.moved == 0
    assert_exactly_once(output, tmp_path / "out.errors.jsonl", SMALL_REQUESTS)
    assert jobs_per_shard(daemons, summary.run_id) == Counter(
        {name: 1 for name in shard_names(work)})


def test_a_lost_daemon_that_comes_back_is_used_again(ray_cluster, daemons, batch_file,
                                                     tmp_path):
    """The two other daemons are paused (SIGSTOP) from the moment the victim is killed until the
    driver uses it again, so shards are still waiting when it comes back however fast the host
    is (paused only once the victim was lost, they could finish every shard in the seconds the
    driver takes to declare it lost). A pause shorter than the gRPC deadline (30 s) fails no
    call: they do not look down."""
    output, work = tmp_path / "out.jsonl", tmp_path / "work"
    victim, others = daemons[0], daemons[1:]
    thread, box = run_in_thread(
        source=batch_file, servers=[d.addr for d in daemons], output=output, work_dir=work,
        shard_requests=SHARD_REQUESTS, in_flight=2, lost_after=3, poll_interval=0.2,
        ray_address=ray_cluster, progress=sys.stderr, interval=5)
    wait_for_results(work, 3, stop=lambda: not thread.is_alive())

    def lost():
        return json.loads((work / "state.json").read_text())["lost"]

    for d in others:
        os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        victim.kill9()
        deadline = time.time() + 20
        while victim.addr not in lost():
            assert time.time() < deadline and thread.is_alive(), "the daemon was not declared lost"
            time.sleep(0.05)
        back_at = time.time()
        victim.start()
        deadline = time.time() + 20
        while victim.addr in lost():
            assert time.time() < deadline and thread.is_alive(), "the daemon was not used again"
            time.sleep(0.05)
    finally:
        for d in others:
            os.kill(d.proc.pid, signal.SIGCONT)
    summary = finish(thread, box)
    print(f"lost and back run: {summary.describe()}")
    assert summary.ok and summary.lost == [victim.addr] and summary.moved >= 1
    assert_exactly_once(output, tmp_path / "out.errors.jsonl")
    # It ran new shards after it came back.
    with Client(victim.addr, timeout=30) as c:
        new_jobs = [j for j in c.list_jobs(page_size=1000)
                    if j.metadata.get(RUN_KEY) == summary.run_id and j.created_at >= back_at - 1]
    assert new_jobs, "the daemon got no shard after it came back"


def test_no_daemon_reachable(ray_cluster, batch_file, tmp_path):
    from moebatch.ray_driver import ShardRunError

    closed = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    with pytest.raises(ShardRunError, match="no daemon reachable") as e:
        finish(*run_in_thread(source=batch_file, servers=closed, output=tmp_path / "out.jsonl",
                              ray_address=ray_cluster, progress=None, timeout=5))
    assert all(addr in str(e.value) for addr in closed)
    assert not (tmp_path / "out.jsonl").exists()


def test_a_line_the_daemon_refuses_fails_alone(ray_cluster, daemons, tmp_path):
    # 40 requests in 4 shards; shard 1 holds two lines the daemon refuses (split_file only
    # checks JSON and custom_id). The daemon refuses shard 1 as a whole, so it runs in halves
    # down to the two lines, which go to the errors file with the daemon's message.
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    bad = {13: {"max_tokens": 0}, 17: {"temperature": -1}}
    with open(source, "w") as f:
        for i in range(40):
            body = {"prompt": f"Request {i}", "max_tokens": 4, "temperature": 0, **bad.get(i, {})}
            f.write(json.dumps({"custom_id": f"r{i:02d}", "method": "POST",
                                "url": "/v1/completions", "body": body}) + "\n")
    summary = finish(*run_in_thread(
        source=source, servers=[d.addr for d in daemons], output=output,
        shard_requests=10, in_flight=2, poll_interval=0.2, ray_address=ray_cluster,
        progress=None))
    assert summary.ok and (summary.completed, summary.failed) == (38, 2)
    assert ids_in(output) == [f"r{i:02d}" for i in range(40) if i not in bad]
    with open(tmp_path / "out.errors.jsonl") as f:
        errors = [json.loads(line) for line in f]
    assert [e["custom_id"] for e in errors] == ["r13", "r17"]
    assert all(e["error"]["code"] == "invalid_request" for e in errors)
    assert "body.max_tokens" in errors[0]["error"]["message"]
    assert "body.temperature" in errors[1]["error"]["message"]
    per_shard = jobs_per_shard(daemons, summary.run_id)
    assert per_shard["shard-00001"] > 1
    assert all(per_shard[f"shard-0000{i}"] == 1 for i in (0, 2, 3))


def test_every_daemon_lost_stops_the_run_and_a_rerun_finishes_it(ray_cluster, daemons,
                                                                 small_batch_file, tmp_path):
    from moebatch.ray_driver import ShardRunError

    output, work = tmp_path / "out.jsonl", tmp_path / "work"
    args = dict(source=small_batch_file, servers=[d.addr for d in daemons], output=output,
                work_dir=work, shard_requests=SMALL_SHARD_REQUESTS, in_flight=2, lost_after=2,
                poll_interval=0.2, ray_address=ray_cluster, progress=sys.stderr, interval=5)
    thread, box = run_in_thread(**args)
    wait_for_results(work, 6, stop=lambda: not thread.is_alive())
    for d in daemons:
        d.kill9()
    with pytest.raises(ShardRunError, match="no daemon left"):
        finish(thread, box)
    assert not output.exists()
    done_before = {p.name: p.stat().st_mtime_ns for p in (work / "results").glob("shard-*")}
    for d in daemons:
        d.start()
    summary = finish(*run_in_thread(**args))
    print(f"all lost, rerun: {summary.describe()}")
    assert summary.ok and summary.sessions == 2
    assert summary.shards_run == 30 - len(done_before)
    assert_exactly_once(output, tmp_path / "out.errors.jsonl", SMALL_REQUESTS)
    for name, mtime in done_before.items():
        assert (work / "results" / name).stat().st_mtime_ns == mtime, name
