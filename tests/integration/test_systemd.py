"""systemd: the unit passes `systemd-analyze verify`, and a real moebatchd talks
the sd_notify protocol to a real unix datagram socket (NOTIFY_SOCKET): READY=1 once it serves,
WATCHDOG=1 pings when WATCHDOG_USEC is set, STOPPING=1 on SIGTERM, then exit status 0."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import BUILD, ROOT, Daemon, free_port

UNIT = ROOT / "deploy" / "moebatchd.service"


def test_unit_verifies(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (scripts/install_deps.sh installs systemd)")
    binary = (BUILD / "server" / "moebatchd").resolve()
    unit = tmp_path / "moebatchd.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/moebatchd", str(binary)))
    run = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == "" and run.stdout.strip() == "", run.stderr + run.stdout
    # The check is real: a mistake in the unit is reported.
    bad = tmp_path / "bad" / "moebatchd.service"
    bad.parent.mkdir()
    bad.write_text(unit.read_text().replace("Type=notify", "Type=notifyy"))
    run = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True)
    assert "notifyy" in run.stderr + run.stdout


def receive(sock, want: str, timeout: float):
    """Datagrams until one contains the line `want`; all of them."""
    got = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        sock.settimeout(max(0.05, deadline - time.time()))
        try:
            got.append(sock.recv(4096).decode())
        except socket.timeout:
            break
        if want in got[-1].splitlines():
            return got
    raise AssertionError(f"no {want} within {timeout} s; received {got}")


def test_notify_ready_watchdog_stopping(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    env = dict(os.environ, NOTIFY_SOCKET=str(path), WATCHDOG_USEC="400000")
    env.pop("WATCHDOG_PID", None)
    daemon = Daemon(tmp_path / "data", env=env).start()
    try:
        got = receive(sock, "READY=1", 60)
        assert any(line.startswith("STATUS=serving") for m in got for line in m.splitlines())
        # Pings every half interval (0.2 s) while the engine thread loops.
        pings = 0
        deadline = time.time() + 3
        while time.time() < deadline and pings < 3:
            pings += sum(1 for m in receive(sock, "WATCHDOG=1", 2) if "WATCHDOG=1" in m)
        assert pings >= 3
        daemon.proc.send_signal(signal.SIGTERM)
        receive(sock, "STOPPING=1", 30)
        assert daemon.proc.wait(timeout=60) == 0
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
        sock.close()


def test_install_script_stages_the_service(tmp_path):
    dest = tmp_path / "root"
    run = subprocess.run([str(ROOT / "deploy" / "install.sh"), "--build-dir", str(BUILD),
                          "--destdir", str(dest)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    for path in ["usr/local/bin/moebatchd", "usr/local/bin/moebatch-run",
                 "usr/local/bin/moebatch-plan", "usr/local/bin/moebatch-token",
                 "etc/systemd/system/moebatchd.service", "etc/moebatch/moebatchd.json",
                 "etc/moebatch/tokens.json", "usr/local/share/doc/moebatch/operations.md"]:
        assert (dest / path).exists(), path
    # An empty tokens file the daemon accepts, not world-readable.
    assert json.loads((dest / "etc/moebatch/tokens.json").read_text()) == {"tokens": []}
    assert (dest / "etc/moebatch/tokens.json").stat().st_mode & 0o007 == 0
    assert os.access(dest / "usr/local/bin/moebatchd", os.X_OK)
    # A second run keeps an edited configuration.
    (dest / "etc/moebatch/moebatchd.json").write_text('{"listen": "127.0.0.1:6000"}')
    run = subprocess.run([str(ROOT / "deploy" / "install.sh"), "--build-dir", str(BUILD),
                          "--destdir", str(dest)], capture_output=True, text=True)
    assert run.returncode == 0 and "keeping" in run.stdout
    assert "6000" in (dest / "etc/moebatch/moebatchd.json").read_text()


def test_example_config_is_accepted(tmp_path):
    """deploy/moebatchd.json names only real flags, and every flag of moebatchd but the one-shot
    --config and --dry_run; the daemon starts
    from it (model, paths, listen and metrics addresses overridden on the command line, which
    wins) with its tokens file (an empty one, as install.sh creates)."""
    config = json.loads((ROOT / "deploy" / "moebatchd.json").read_text())
    sources = (ROOT / "server" / "moebatchd_main.cc").read_text() + \
        (ROOT / "engine" / "tools" / "engine_flags.cc").read_text()
    flags = set(re.findall(r"ABSL_FLAG\(\s*[\w:]+,\s*(\w+),", sources))
    assert len(flags) > 30
    one_shot = {"config", "dry_run"}  # a command's, not a service's
    assert flags - one_shot <= set(config), sorted(flags - one_shot - set(config))
    tokens = tmp_path / "tokens.json"
    tokens.write_text('{"tokens": []}')
    daemon = Daemon(tmp_path / "data", extra_args=[
        "--config", str(ROOT / "deploy" / "moebatchd.json"), "--kv_cache_gb", "0.25",
        "--compute_dtype", "f32", "--tokens_file", str(tokens),
        "--metrics_listen", f"127.0.0.1:{free_port()}"])
    daemon.start()
    try:
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=60) == 0
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
