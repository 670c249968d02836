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

    def __init__(self, data_dir: Path, extra_args=(), env=None, tls_ca: Path | None = None,
                 tls_client: tuple[Path, Path] | None = None, model: Path = MODEL):
        self.data_dir = data_dir
        self.model = model  # the --model directory (the tiny Mixtral unless given)
        self.tls_ca = tls_ca  # the daemon serves TLS: wait for it over a TLS channel
        self.tls_client = tls_client  # (certificate, key) when it requires client certificates
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
            [str(binary), "--model", str(self.model), "--listen", self.addr, "--data-dir",
             str(self.data_dir), "--kv-cache-gb", "0.25", *self.extra_args],
            stdout=log, stderr=log, env=self.env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, f"moebatchd exited: {self.log.read_text()[-2000:]}"
            # Listening, and the model is loaded. The service's own name: the overall status ("")
            # reads SERVING for an instant after the port opens, before the daemon sets it.
            if self.health("moebatch.v1.BatchService") == "SERVING":
                return self
            time.sleep(0.1)
        raise AssertionError(f"moebatchd did not start: {self.log.read_text()[-2000:]}")

    def channel(self) -> grpc.Channel:
        if self.tls_ca is None:
            return grpc.insecure_channel(self.addr)
        cert, key = (p.read_bytes() for p in self.tls_client) if self.tls_client else (None, None)
        credentials = grpc.ssl_channel_credentials(self.tls_ca.read_bytes(), key, cert)
        return grpc.secure_channel(self.addr, credentials)

    def health(self, service: str = "") -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", or the gRPC error code's name when the
        call fails (e.g. "UNAVAILABLE" before the daemon listens). Raw bytes: HealthCheckRequest
        is field 1 (service, string); HealthCheckResponse is field 1 (status, enum)."""
        request = (b"\x0a" + bytes([len(service)]) + service.encode()) if service else b""
        with self.channel() as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            try:
                response = check(request, timeout=2)
            except grpc.RpcError as e:
                return e.code().name
        status = response[1] if len(response) >= 2 and response[0] == 0x08 else 0
        return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}[status]

    def memory_kib(self) -> dict:
        """VmRSS and VmHWM (peak RSS) of the running daemon, KiB, from /proc/<pid>/status."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU time the running daemon has used so far, seconds."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

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
