"""`moebatch ray-daemons` (moebatch.ray_daemons): one moebatchd per GPU node of a Ray cluster.

A Ray cluster of three nodes on this machine (ray.cluster_utils.Cluster): a head without GPUs and
two nodes that declare one GPU each (Ray's GPU resource; the daemons run the cpu backend with the
tiny model, as there is no GPU here). Checked: start puts one daemon on each GPU node and none on
the head, each serving on its node's address with its own data dir; a second start finds the group;
`moebatch shard --servers ray` runs a file across them, every custom_id exactly once; a daemon
killed with kill -9 is started again by its actor and serves again; list and stop; too few GPU
nodes and arguments ray-daemons sets itself are refused with the reason.

Loopback only (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, as test_ray_shard.py). Skipped without Ray.
"""
import json
import os
import signal
import subprocess
import sys
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest  # noqa: E402

ray = pytest.importorskip("ray")

from conftest import BUILD, MODEL  # noqa: E402
from moebatch import Client  # noqa: E402
from moebatch import ray_daemons  # noqa: E402

DAEMON_ARGS = ["--model", str(MODEL), "--kv-cache-gb", "0.25", "--backend", "cpu"]
N_REQUESTS = 400


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": 80 << 20, "node_ip_address": "127.0.0.1"}
    c = Cluster(initialize_head=True, head_node_args={**node, "num_gpus": 0,
                                                       "include_dashboard": False})
    for _ in range(2):
        c.add_node(**node, num_gpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    gpu_node_ids = {n["NodeID"] for n in ray.nodes() if n["Resources"].get("GPU", 0) > 0}
    assert len(gpu_node_ids) == 2
    yield c, gpu_node_ids
    try:
        ray_daemons.stop(grace=10)
    finally:
        ray.shutdown()
        c.shutdown()


def moebatch_cli(*args, timeout=300):
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    return subprocess.run([sys.executable, "-m", "moebatch", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_one_daemon_per_gpu_node_runs_a_sharded_file_and_survives_kill_9(cluster, tmp_path):
    c, gpu_node_ids = cluster
    with pytest.raises(ValueError, match="--listen is set by ray-daemons"):
        ray_daemons.start([*DAEMON_ARGS, "--listen", "127.0.0.1:1"])
    with pytest.raises(ray_daemons.DaemonGroupError,
                       match="2 Ray nodes with 1 GPUs alive after 1 s, fewer than the 3"):
        ray_daemons.start(DAEMON_ARGS, moebatchd=str(BUILD / "server" / "moebatchd"), port=0,
                          min_nodes=3, wait=1)

    started = time.monotonic()
    daemons = ray_daemons.start(DAEMON_ARGS, moebatchd=str(BUILD / "server" / "moebatchd"),
                                port=0, data_dir=str(tmp_path / "{node}"), wait=60,
                                ready_timeout=120)
    print(f"2 daemons up in {time.monotonic() - started:.1f} s: "
          f"{[(d.address, d.node_id[:12]) for d in daemons]}")
    assert len(daemons) == 2
    assert {d.node_id for d in daemons} == gpu_node_ids  # one per GPU node, none on the head
    assert len({d.address for d in daemons}) == 2
    for d in daemons:
        assert d.address.startswith("127.0.0.1:") and d.pid > 0 and d.restarts == 0
        assert (tmp_path / d.node_id[:12] / "moebatchd.log").exists()
        with Client(d.address) as client:
            client.wait_ready(timeout=10)
    # A second start finds the group; other arguments are refused while it runs.
    again = ray_daemons.start(DAEMON_ARGS, moebatchd=str(BUILD / "server" / "moebatchd"),
                              port=0, data_dir=str(tmp_path / "{node}"))
    assert [(d.address, d.pid) for d in again] == [(d.address, d.pid) for d in daemons]
    with pytest.raises(ray_daemons.DaemonGroupError, match="stop it first"):
        ray_daemons.start([*DAEMON_ARGS, "--max_in_flight", "8"],
                          moebatchd=str(BUILD / "server" / "moebatchd"))

    # `moebatch shard --servers ray` over the group.
    source = tmp_path / "batch.jsonl"
    with open(source, "w") as f:
        for i in range(N_REQUESTS):
            f.write(json.dumps({"custom_id": f"r{i:04d}", "method": "POST",
                                "url": "/v1/completions",
                                "body": {"prompt": f"Item {i}:", "max_tokens": 4,
                                         "temperature": 0}}) + "\n")
    out = tmp_path / "out.jsonl"
    run = moebatch_cli("shard", str(source), "--servers", "ray", "-o", str(out),
                       "--ray-address", c.address, "--shard-requests", "50", "--in-flight", "2",
                       "--poll-interval", "0.2", "--no-progress")
    assert run.returncode == 0, run.stderr[-3000:]
    with open(out) as f:
        ids = [json.loads(line)["custom_id"] for line in f]
    assert ids == [f"r{i:04d}" for i in range(N_REQUESTS)]
    served = set()
    for d in daemons:
        with Client(d.address) as client:
            if client.list_jobs(page_size=100):
                served.add(d.address)
    assert served == {d.address for d in daemons}, "both daemons ran shards"

    # kill -9: the actor starts the daemon again, on the same address and data dir.
    victim = daemons[0]
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.time() + 60
    while True:
        now = {d.address: d for d in ray_daemons.list_daemons()}[victim.address]
        if now.restarts >= 1 and now.pid and now.pid != victim.pid:
            break
        assert time.time() < deadline, "the daemon was not started again"
        time.sleep(0.2)
    with Client(victim.address) as client:
        client.wait_ready(timeout=60)
        assert client.list_jobs(page_size=100), "its job store survived"

    listed = moebatch_cli("ray-daemons", "list", "--ray-address", c.address)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert sorted(line.split("\t")[0] for line in lines) == sorted(d.address for d in daemons)
    assert any("1 restarts" in line for line in lines)

    pids = [d.pid for d in ray_daemons.list_daemons()]
    stopped = moebatch_cli("ray-daemons", "stop", "--grace", "20", "--ray-address", c.address)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 2 daemons" in stopped.stderr
    deadline = time.time() + 30
    while any(alive(pid) for pid in pids):
        assert time.time() < deadline, "a daemon outlived stop"
        time.sleep(0.2)
    assert ray_daemons.list_daemons() == []
    none = moebatch_cli("shard", str(source), "--servers", "ray", "-o", str(tmp_path / "o2.jsonl"),
                        "--ray-address", c.address, "--no-progress")
    assert none.returncode == 1 and "no daemon group runs" in none.stderr


def test_a_daemon_that_cannot_start_fails_the_start_with_its_log(cluster, tmp_path):
    missing = tmp_path / "no-such-model"
    started = time.monotonic()
    with pytest.raises(ray_daemons.DaemonGroupError, match="exited with .* before it served") as e:
        ray_daemons.start(["--model", str(missing), "--backend", "cpu"],
                          moebatchd=str(BUILD / "server" / "moebatchd"), port=0,
                          data_dir=str(tmp_path / "{node}"), wait=30, ready_timeout=120)
    assert str(missing) in str(e.value)  # the daemon's own message, from its log
    assert time.monotonic() - started < 60  # not the ready timeout
    assert ray_daemons.list_daemons() == []  # nothing left behind
    with pytest.raises(ray_daemons.DaemonGroupError, match="cannot start /nonexistent/moebatchd"):
        ray_daemons.start(["--model", str(MODEL)], moebatchd="/nonexistent/moebatchd", port=0,
                          data_dir=str(tmp_path / "{node}"), wait=30, ready_timeout=60)
    assert ray_daemons.list_daemons() == []
