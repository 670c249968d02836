"""A real moebatchd whose data dir fills up mid-job (a small tmpfs, filled by a file): the engine
keeps going and holds its results, health says NOT_SERVING, CreateJob answers RESOURCE_EXHAUSTED
naming the data dir; when space returns, health is SERVING again and the job completes with every
custom_id exactly once, without a restart. Needs root for the tmpfs mount (as CI runs)."""
import os
import subprocess
import time

import grpc
import pytest

from conftest import Daemon
from moebatch import Client, ClientError


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path):
    """Writes zeros to `path` until the file system is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def wait_for(predicate, seconds: float, what: str):
    deadline = time.time() + seconds
    while not predicate():
        assert time.time() < deadline, what
        time.sleep(0.2)


def test_a_full_disk_holds_results_and_resumes(tmp_path, small_disk):
    d = Daemon(small_disk / "data")
    d.log = tmp_path / "moebatchd.log"  # the log on the big disk
    d.start()
    try:
        c = Client(d.addr, timeout=60)
        requests = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                     "body": {"prompt": [1, 2, 3 + i], "max_tokens": 600, "ignore_eos": True}}
                    for i in range(48)]
        job = c.create_job(requests=requests)
        filler = small_disk / "filler"
        fill(filler)
        # A new job cannot be stored: RESOURCE_EXHAUSTED naming where the space is missing.
        with pytest.raises(ClientError) as e:
            for _ in range(50):  # until SQLite needs a new page
                c.create_job(requests=requests[:8])
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "full" in e.value.message and str(small_disk) in e.value.message
        # The store's health follows its last write: the failed CreateJob's, then the monitor's
        # probe (a one-row write that may still fit) and the worker's result commits, the first
        # of which comes once a sequence has generated its 600 tokens (~12 s here; over 30 s on a
        # loaded 2-core host).
        wait_for(lambda: d.health("moebatch.v1.BatchService") == "NOT_SERVING", 120,
                 "health stayed SERVING with the disk full")
        assert d.proc.poll() is None
        filler.unlink()
        wait_for(lambda: d.health("moebatch.v1.BatchService") == "SERVING", 60,
                 "health did not come back once the disk had space")
        c.wait(job.id)
        lines = list(c.results(job.id))
        assert sorted(l["custom_id"] for l in lines) == sorted(f"r{i}" for i in range(48))
        assert all(l["response"]["status_code"] == 200 for l in lines)
        assert c.get_job(job.id).request_counts.completed == 48
    finally:
        d.stop()
    assert d.proc.returncode == 0
