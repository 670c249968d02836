"""Fixtures for the integration tests: a real moebatchd on loopback, a real Python client.

The daemon binary comes from $MOEBATCH_BUILD_DIR/server/moebatchd (default: build/ at the repository
root); the model is the tiny golden Mixtral in tests/fixtures (tokenizer.model fetched by
scripts/fetch_tokenizer.sh).
"""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("MOEBATCH_BUILD_DIR", ROOT / "build"))
MODEL = ROOT / "tests" / "fixtures" / "tiny-mixtral"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A moebatchd process on a data dir; start/kill/stop it like an operator would."""

    def __init__(self, data_dir: Path, extra_args=(), env=None):
        self.data_dir = data_dir
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.extra_args = list(extra_args)
        self.env = env
        self.proc = None
        self.log = data_dir / "moebatchd.log"

    def start(self, timeout: float = 60.0) -> "Daemon":
        binary = BUILD / "server" / "moebatchd"
        assert binary.exists(), f"{binary} not built"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [str(binary), "--model", str(MODEL), "--listen", self.addr, "--data-dir",
             str(self.data_dir), "--kv-cache-gb", "0.25", *self.extra_args],
            stdout=log, stderr=log, env=self.env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, f"moebatchd exited: {self.log.read_text()[-2000:]}"
            try:
                grpc.channel_ready_future(grpc.insecure_channel(self.addr)).result(timeout=0.5)
                return self
            except grpc.FutureTimeoutError:
                pass
        raise AssertionError(f"moebatchd did not start: {self.log.read_text()[-2000:]}")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "data").start()
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    from moebatch import Client
    return Client(daemon.addr, timeout=60)
