"""1,000 WatchJob streams at once against a real moebatchd: the streams it serves stay within
--max_streams (each holds a server thread while it waits), the rest get a clear
RESOURCE_EXHAUSTED at once, the daemon's threads stay bounded, and unary calls keep working."""
import time
from pathlib import Path

import grpc

from conftest import Daemon
from moebatch import Client
from moebatch.v1 import batch_pb2 as pb
from moebatch.v1 import batch_pb2_grpc as pb_grpc


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_a_thousand_watchers(tmp_path):
    d = Daemon(tmp_path / "data", ["--max_streams", "50"]).start()
    try:
        c = Client(d.addr, timeout=60)
        job = c.create_job(requests=[{
            "custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
            "body": {"prompt": [1, 2, 3], "max_tokens": 4000, "ignore_eos": True}}
            for i in range(32)])
        idle_threads = threads_of(d.proc.pid)
        channel = grpc.insecure_channel(d.addr)
        stub = pb_grpc.BatchServiceStub(channel)
        streams = [stub.WatchJob(pb.WatchJobRequest(job_id=job.id), timeout=120)
                   for _ in range(1000)]
        served, refused, by_grpc = [], [], 0
        for s in streams:
            try:
                next(s)
                served.append(s)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                # The daemon refuses a stream beyond --max_streams in its handler, on a server
                # thread; in a burst of 1,000 calls those threads can all be busy refusing, and
                # gRPC's thread quota (max_streams + 64) then refuses the call itself, before the
                # handler: the same code, gRPC's message. Either way the call is refused at once.
                if "Server Threadpool Exhausted" in e.details():
                    by_grpc += 1
                else:
                    assert "--max_streams" in e.details(), e.details()
                refused.append(s)
        assert len(served) == 50 and len(refused) == 950
        assert by_grpc < len(refused), "no refusal came from the daemon's --max_streams check"
        # Bounded: the 50 streams' threads and gRPC's own, not one per watcher.
        assert threads_of(d.proc.pid) <= idle_threads + 50 + 64
        # Unary calls still answer while the streams wait.
        t0 = time.time()
        assert c.get_job(job.id).id == job.id
        assert time.time() - t0 < 10
        for s in served:
            s.cancel()
        # The slots come back: a new watcher is served once the others are gone.
        deadline = time.time() + 10
        while True:
            try:
                next(stub.WatchJob(pb.WatchJobRequest(job_id=job.id), timeout=10))
                break
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.time() < deadline
                time.sleep(0.2)
        c.cancel(job.id)
        channel.close()
    finally:
        d.stop()
