"""What a real moebatchd refuses at start, before it binds or opens its job store: a TLS key of
another certificate, an expired or not-yet-valid certificate, a port another daemon holds, a data
dir another daemon holds; and after a failed model load it says why last, not "signal 15".
Certificates come from the openssl command line (a throw-away CA; `openssl ca` for chosen dates).
"""
import subprocess
from pathlib import Path

import pytest

from conftest import BUILD, MODEL, Daemon, free_port


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA; server.pem/server.key for localhost; other.key (another key); expired.pem and
    future.pem (server.key's, issued for 2020 and for 2090)."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=moebatch test CA", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost", cwd=d)
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext", cwd=d)
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out",
            "other.key", cwd=d)
    (d / "index.txt").write_text("")
    (d / "serial").write_text("1000\n")
    (d / "newcerts").mkdir()
    (d / "ca.cnf").write_text(
        "[ca]\ndefault_ca = test\n[test]\ndir = .\ndatabase = index.txt\nserial = serial\n"
        "new_certs_dir = newcerts\ndefault_md = sha256\npolicy = anything\n"
        "unique_subject = no\n[anything]\ncommonName = supplied\n")
    for name, start, end in (("expired", "20200101000000Z", "20200102000000Z"),
                             ("future", "20900101000000Z", "20900102000000Z")):
        openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key",
                "-startdate", start, "-enddate", end, "-in", "server.csr", "-out", f"{name}.pem",
                cwd=d)
    return d


def start_and_fail(tmp_path: Path, *args: str, data_dir: Path | None = None, port: int = 0):
    """Runs moebatchd expecting it to refuse to start; returns (exit code, stderr)."""
    out = subprocess.run(
        [str(BUILD / "server" / "moebatchd"), "--model", str(MODEL), "--listen",
         f"127.0.0.1:{port or free_port()}", "--data-dir", str(data_dir or tmp_path / "data"),
         "--kv-cache-gb", "0.25", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stderr[-2000:]
    return out.returncode, out.stderr


@pytest.mark.parametrize("cert,key,words", [
    ("server.pem", "other.key", ["--tls_key", "does not belong"]),
    ("expired.pem", "server.key", ["--tls_cert", "expired on", "2020"]),
    ("future.pem", "server.key", ["--tls_cert", "not valid yet", "2090"]),
])
def test_a_bad_certificate_or_key_is_refused_before_binding(tmp_path, pki, cert, key, words):
    port = free_port()
    code, err = start_and_fail(tmp_path, "--tls_cert", str(pki / cert), "--tls_key",
                               str(pki / key), port=port)
    assert code == 2
    for w in words:
        assert w in err, err[-2000:]
    assert "moebatchd: listening on" not in err  # refused before the port was bound
    # The good pair starts (the same files but the key), so the refusal was the pair's.
    if cert == "server.pem":
        d = Daemon(tmp_path / "good", ["--tls_cert", str(pki / "server.pem"), "--tls_key",
                                       str(pki / "server.key")], tls_ca=pki / "ca.pem").start()
        d.stop()


def test_a_second_daemon_on_a_port_in_use_fails_clearly(tmp_path):
    first = Daemon(tmp_path / "first").start()
    try:
        code, err = start_and_fail(tmp_path, data_dir=tmp_path / "second", port=first.port)
        assert code == 1
        assert f"--listen 127.0.0.1:{first.port}" in err and "in use" in err, err[-2000:]
        assert "serving" not in err
        assert first.health("moebatch.v1.BatchService") == "SERVING"
    finally:
        first.stop()


def test_a_second_daemon_on_a_data_dir_in_use_is_refused_with_its_pid(tmp_path):
    first = Daemon(tmp_path / "data").start()
    try:
        code, err = start_and_fail(tmp_path, data_dir=tmp_path / "data")
        assert code == 1
        assert "in use by another moebatchd" in err and f"pid {first.proc.pid}" in err, err
        assert "moebatchd: listening on" not in err
    finally:
        first.stop()
    # Once the first one has stopped (or died: the kernel drops the lock), the dir is free.
    again = Daemon(tmp_path / "data").start()
    again.kill9()
    Daemon(tmp_path / "data").start().stop()


def test_a_failed_load_logs_its_reason_last_and_no_signal(tmp_path):
    bad_model = tmp_path / "model"
    bad_model.mkdir()
    (bad_model / "config.json").write_text('{"model_type": "mixtral"}')
    out = subprocess.run(
        [str(BUILD / "server" / "moebatchd"), "--model", str(bad_model), "--listen",
         f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert "cannot load model" in lines[-1], out.stderr[-2000:]
    assert "signal 15" not in out.stderr


def test_a_damaged_store_is_refused_at_start_with_the_file_named(tmp_path):
    d = Daemon(tmp_path / "data").start()
    from moebatch import Client
    c = Client(d.addr, timeout=30)
    for i in range(40):
        c.create_job(requests=[{"custom_id": f"r{j}", "method": "POST",
                                "url": "/v1/completions",
                                "body": {"prompt": [1, 2, 3], "max_tokens": 1}}
                               for j in range(20)], metadata={"i": str(i) * 100})
    d.stop()
    db = tmp_path / "data" / "moebatch.db"
    size = db.stat().st_size
    assert size > 16 * 4096
    with open(db, "r+b") as f:  # a zeroed 4 KiB page in the middle
        f.seek(size // 4096 // 2 * 4096)
        f.write(b"\0" * 4096)
    code, err = start_and_fail(tmp_path, data_dir=tmp_path / "data")
    assert code == 1
    assert "moebatch.db" in err and "damaged" in err, err[-2000:]


def test_invalid_utf8_in_the_store_never_reaches_a_client(tmp_path):
    """Bytes that are not UTF-8 in a stored string (a damaged file that SQLite's checks pass)
    reach the client as U+FFFD, never as a reply protobuf cannot parse."""
    import sqlite3
    d = Daemon(tmp_path / "data").start()
    from moebatch import Client
    c = Client(d.addr, timeout=30)
    job = c.create_job(requests=[{"custom_id": "a", "method": "POST", "url": "/v1/completions",
                                  "body": {"prompt": [1, 2], "max_tokens": 1}}])
    c.wait(job.id)
    d.stop()
    db = sqlite3.connect(tmp_path / "data" / "moebatch.db")
    db.execute("UPDATE jobs SET model = CAST(X'6D6F64656CFF' AS TEXT), error = "
               "CAST(X'C328' AS TEXT) WHERE id = ?", (job.id,))
    db.execute("UPDATE results SET custom_id = CAST(X'61E2' AS TEXT) WHERE job_id = ?", (job.id,))
    db.commit()
    db.close()
    d = Daemon(tmp_path / "data").start()
    try:
        c = Client(d.addr, timeout=30)
        got = c.get_job(job.id)
        assert got.model == "model\ufffd" and got.error == "\ufffd("
        assert [r.custom_id for r in c.result_messages(job.id)] == ["a\ufffd"]
        assert any(j.id == job.id for j in c.list_jobs_page().jobs)
    finally:
        d.stop()


def test_an_empty_store_file_starts_with_a_warning(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "moebatch.db").write_bytes(b"")
    d = Daemon(data).start()
    d.stop()
    assert "exists but is empty (0 bytes)" in d.log.read_text()


def test_max_in_flight_defaults_to_twice_the_sequences_a_pass_decodes(tmp_path):
    d = Daemon(tmp_path / "auto", ["--max_num_seqs", "61"]).start()
    try:
        assert ("at most 122 requests in the engine at once (--max_in_flight 0: automatic)"
                in d.log.read_text())
    finally:
        d.stop()
    d = Daemon(tmp_path / "fixed", ["--max_in_flight", "7"]).start()
    try:
        log = d.log.read_text()
        assert "at most 7 requests in the engine at once" in log and "automatic" not in log
    finally:
        d.stop()
    run = subprocess.run([str(BUILD / "server" / "moebatchd"), "--model", str(MODEL), "--data-dir",
                          str(tmp_path / "neg"), "--max_in_flight", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--max_in_flight must be >= 0 (0: automatic), got -1" in run.stderr
