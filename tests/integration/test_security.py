"""Authentication, tenancy and TLS of a real moebatchd on loopback.

Tokens come from the real `moebatch-token` tool into a real tokens file; certificates from the
openssl command line (a throw-away CA, a server certificate for localhost / 127.0.0.1, a client
certificate).
"""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from conftest import BUILD, MODEL, Daemon, free_port

GOLDEN = [json.loads(l) for l in open(MODEL / "golden.jsonl")]


def completion(custom_id: str, i: int = 0, max_tokens: int = 4) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"prompt": GOLDEN[i]["prompt_token_ids"], "max_tokens": max_tokens,
                     "temperature": 0}}


def make_token(tokens_file: Path, tenant: str, role: str = "user") -> str:
    out = subprocess.run([str(BUILD / "server" / "moebatch-token"), "--tenant", tenant, "--role",
                          role, "--tokens_file", str(tokens_file)],
                         capture_output=True, text=True, check=True)
    token = out.stdout.strip()
    assert token.startswith("mbt_") and len(token) == 68, out
    return token


@pytest.fixture
def tenants(tmp_path):
    """A daemon with a tokens file of two tenants and an admin; their tokens."""
    tokens_file = tmp_path / "tokens.json"
    tokens = {"a": make_token(tokens_file, "team-a"), "b": make_token(tokens_file, "team-b"),
              "admin": make_token(tokens_file, "ops", "admin")}
    # The file holds digests only, never a token.
    text = tokens_file.read_text()
    assert not any(t in text for t in tokens.values())
    d = Daemon(tmp_path / "data", ["--tokens_file", str(tokens_file)]).start()
    yield d, tokens, tokens_file
    d.stop()


def client(daemon, token=None, **kw):
    from moebatch import Client
    return Client(daemon.addr, timeout=30, token=token, **kw)


def code_of(fn):
    from moebatch import ClientError
    with pytest.raises(ClientError) as e:
        result = fn()
        if hasattr(result, "__next__"):
            list(result)
    return e.value.code, e.value.message


def test_calls_without_a_valid_token_are_unauthenticated(tenants, monkeypatch):
    daemon, tokens, _ = tenants
    monkeypatch.delenv("MOEBATCH_TOKEN", raising=False)
    for token in (None, "mbt_" + "0" * 64, "not-a-token"):
        c = client(daemon, token)
        for call in (lambda: c.create_job(requests=[completion("x")]),
                     lambda: c.get_job("job_x"), lambda: c.list_jobs_page(),
                     lambda: c.cancel("job_x"), lambda: c.watch("job_x"),
                     lambda: c.result_messages("job_x", wait=False)):
            code, message = code_of(call)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (token, message)
            if token:
                assert token not in message
    # Health needs no token (probes, systemd).
    assert daemon.health() == "SERVING"
    # The right token works.
    job = client(daemon, tokens["a"]).create_job(requests=[completion("ok")])
    assert job.tenant == "team-a"


def test_a_tenant_never_sees_another_tenants_job(tenants):
    daemon, tokens, _ = tenants
    a, b, admin = (client(daemon, tokens[k]) for k in ("a", "b", "admin"))
    job = a.create_job(requests=[completion(f"r{i}", i) for i in range(3)],
                       metadata={"secret": "a-only"})
    a.wait(job.id)
    b_job = b.create_job(requests=[completion("b0")])

    def not_found(call, job_id):
        code, message = code_of(call)
        assert code == grpc.StatusCode.NOT_FOUND
        # Exactly what an unknown id gets: nothing says the job exists.
        unknown_code, unknown = code_of(lambda: b.get_job("job_000000000000000000000000"))
        assert unknown_code == grpc.StatusCode.NOT_FOUND
        assert message == unknown.replace("job_000000000000000000000000", job_id)
        assert "a-only" not in message and "team-a" not in message

    not_found(lambda: b.get_job(job.id), job.id)
    not_found(lambda: b.cancel(job.id), job.id)
    not_found(lambda: b.watch(job.id), job.id)
    not_found(lambda: b.result_messages(job.id, wait=False), job.id)
    not_found(lambda: b.result_messages(job.id, wait=True), job.id)
    assert [j.id for j in b.list_jobs()] == [b_job.id]
    assert [j.id for j in a.list_jobs()] == [job.id]
    code, _ = code_of(lambda: list(b.list_jobs(tenant="team-a")))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    # The job is intact for its owner.
    assert a.get_job(job.id).request_counts.completed == 3
    assert len(list(a.results(job.id))) == 3

    # The admin sees and may cancel every tenant's jobs, and filter by tenant.
    assert {j.id for j in admin.list_jobs()} == {job.id, b_job.id}
    assert [j.id for j in admin.list_jobs(tenant="team-b")] == [b_job.id]
    assert admin.get_job(job.id).tenant == "team-a"
    assert len(list(admin.results(job.id))) == 3
    long_requests = []
    for i in range(200):
        r = completion(f"long{i}", i % len(GOLDEN), 64)
        r["body"]["ignore_eos"] = True
        long_requests.append(r)
    long_job = b.create_job(requests=long_requests)
    cancelled = admin.cancel(long_job.id)
    assert cancelled.tenant == "team-b"
    final, _ = b.wait(long_job.id)
    from moebatch.jobs import state_name
    assert state_name(final.state) in ("cancelled", "completed")


def test_sighup_reloads_the_tokens_file(tenants):
    daemon, tokens, tokens_file = tenants
    new = make_token(tokens_file, "team-c")
    code, _ = code_of(lambda: client(daemon, new).list_jobs_page())
    assert code == grpc.StatusCode.UNAUTHENTICATED  # not loaded yet
    daemon.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            client(daemon, new).list_jobs_page()
            break
        except Exception:
            time.sleep(0.1)
    assert client(daemon, new).create_job(requests=[completion("c")]).tenant == "team-c"

    # A broken file is refused and the loaded tokens stay.
    good = tokens_file.read_text()
    tokens_file.write_text('{"tokens": [{"sha256": "short"}]}')
    daemon.proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert client(daemon, new).list_jobs_page() is not None
    assert "keeping the" in daemon.log.read_text()

    # Revoking: team-a's entry removed, then SIGHUP.
    entries = json.loads(good)["tokens"]
    json.dump({"tokens": [e for e in entries if e["tenant"] != "team-a"]}, open(tokens_file, "w"))
    daemon.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            client(daemon, tokens["a"]).list_jobs_page()
            time.sleep(0.1)
        except Exception:
            break
    code, _ = code_of(lambda: client(daemon, tokens["a"]).list_jobs_page())
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert daemon.proc.poll() is None


def test_without_a_tokens_file_it_listens_on_loopback_only(tmp_path):
    binary = BUILD / "server" / "moebatchd"
    out = subprocess.run([str(binary), "--model", str(MODEL), "--listen", f"0.0.0.0:{free_port()}",
                          "--data-dir", str(tmp_path / "data")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "loopback" in out.stderr and "--tokens_file" in out.stderr
    # On loopback it starts, and says authentication is off.
    d = Daemon(tmp_path / "data2").start()
    try:
        assert "authentication is off" in d.log.read_text()
        job = client(d).create_job(requests=[completion("x")])
        assert job.tenant == "local"
    finally:
        d.stop()


def test_revoking_a_token_ends_its_open_streams(tenants):
    """A WatchJob opened before SIGHUP removed its token ends with UNAUTHENTICATED within a few
    seconds (streams check their credentials again at least every half second)."""
    daemon, tokens, tokens_file = tenants
    a = client(daemon, tokens["a"])
    long_job = a.create_job(requests=[{
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
        "body": {"prompt": [1, 2, 3], "max_tokens": 4000, "ignore_eos": True}}
        for i in range(32)])
    stream = a.watch(long_job.id)
    next(stream)  # open
    entries = json.loads(tokens_file.read_text())["tokens"]
    json.dump({"tokens": [e for e in entries if e["tenant"] != "team-a"]}, open(tokens_file, "w"))
    daemon.proc.send_signal(signal.SIGHUP)
    t0 = time.time()
    code, _ = code_of(lambda: list(stream))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert time.time() - t0 < 30  # not the job's end (32 x 4000 tokens)
    assert client(daemon, tokens["admin"]).get_job(long_job.id).state == 2  # still in progress
    client(daemon, tokens["admin"]).cancel(long_job.id)


def test_a_bad_tokens_file_stops_the_start(tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text('{"tokens": [{"sha256": "00", "tenant": "a"}]}')
    out = subprocess.run([str(BUILD / "server" / "moebatchd"), "--model", str(MODEL), "--listen",
                          f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data"),
                          "--tokens_file", str(tokens)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "tokens[0].sha256" in out.stderr


# -- TLS -----------------------------------------------------------------------------------------

def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, a server certificate for localhost and 127.0.0.1, and a client certificate."""
    d = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=moebatch test CA", cwd=d)
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject in (("server", "/CN=localhost"), ("client", "/CN=client")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                f"{name}.csr", "-subj", subject, cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile",
                f"{name}.ext", cwd=d)
    return d


def test_tls_round_trip_and_a_plaintext_client_fails_cleanly(tmp_path, certs):
    d = Daemon(tmp_path / "data", ["--tls_cert", str(certs / "server.pem"), "--tls_key",
                                   str(certs / "server.key")], tls_ca=certs / "ca.pem").start()
    try:
        c = client(d, tls_ca=certs / "ca.pem")
        requests = []
        for i, g in enumerate(GOLDEN):
            r = completion(f"g{i}", i, len(g["greedy_token_ids"]))
            r["body"]["ignore_eos"] = True
            requests.append(r)
        job = c.create_job(requests=requests)
        lines = list(c.results(job.id))
        assert [l["custom_id"] for l in lines] == [f"g{i}" for i in range(len(GOLDEN))]
        for i, line in enumerate(lines):
            assert line["response"]["body"]["choices"][0]["token_ids"] == \
                GOLDEN[i]["greedy_token_ids"]

        # Plaintext against the TLS port: a clean UNAVAILABLE within the deadline, no hang, and
        # the daemon keeps serving.
        from moebatch import Client
        plain = Client(d.addr, timeout=3)
        t0 = time.time()
        code, _ = code_of(lambda: plain.list_jobs_page())
        assert code == grpc.StatusCode.UNAVAILABLE
        assert time.time() - t0 < 10
        # A TLS client that does not trust the CA fails the same way.
        code, _ = code_of(lambda: client(d, tls_ca=certs / "client.pem").list_jobs_page())
        assert code == grpc.StatusCode.UNAVAILABLE
        assert c.get_job(job.id).request_counts.completed == len(GOLDEN)
        assert d.proc.poll() is None
    finally:
        d.stop()


def test_mutual_tls_requires_a_client_certificate(tmp_path, certs):
    d = Daemon(tmp_path / "data", ["--tls_cert", str(certs / "server.pem"), "--tls_key",
                                   str(certs / "server.key"), "--tls_client_ca",
                                   str(certs / "ca.pem")], tls_ca=certs / "ca.pem",
               tls_client=(certs / "client.pem", certs / "client.key")).start()
    try:
        with_cert = client(d, tls_ca=certs / "ca.pem", tls_cert=certs / "client.pem",
                           tls_key=certs / "client.key")
        job = with_cert.create_job(requests=[completion("m")])
        assert len(list(with_cert.results(job.id))) == 1
        code, _ = code_of(lambda: client(d, tls_ca=certs / "ca.pem").list_jobs_page())
        assert code == grpc.StatusCode.UNAVAILABLE
    finally:
        d.stop()


def make_server_cert(d: Path, name: str) -> None:
    """A CA of its own (d/name-ca.pem) and a localhost server certificate it signed
    (d/name.pem, d/name.key)."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-ca.key", "-out",
            f"{name}-ca.pem", "-days", "2", "-subj", f"/CN=moebatch test CA {name}", cwd=d)
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", "/CN=localhost", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{name}-ca.pem", "-CAkey",
            f"{name}-ca.key", "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile",
            "server.ext", cwd=d)


def test_renewed_certificates_are_picked_up_without_a_restart(tmp_path):
    """The daemon reads --tls_cert/--tls_key again every --tls_reload_s seconds: after the files
    are replaced (by rename) by a certificate from another CA, clients that trust the new CA get
    in and clients that trust only the old one are refused, with no restart."""
    d = tmp_path / "tls"
    d.mkdir()
    make_server_cert(d, "old")
    make_server_cert(d, "new")
    live_cert, live_key = d / "live.pem", d / "live.key"
    shutil.copy(d / "old.pem", live_cert)
    shutil.copy(d / "old.key", live_key)
    daemon = Daemon(tmp_path / "data", ["--tls_cert", str(live_cert), "--tls_key", str(live_key),
                                        "--tls_reload_s", "1"], tls_ca=d / "old-ca.pem").start()
    try:
        old = client(daemon, tls_ca=d / "old-ca.pem")
        job = old.create_job(requests=[completion("before")])
        assert len(list(old.results(job.id))) == 1
        code, _ = code_of(lambda: client(daemon, tls_ca=d / "new-ca.pem").list_jobs_page())
        assert code == grpc.StatusCode.UNAVAILABLE
        # Renew: new files renamed over the live ones, key first then certificate.
        for src, dst in ((d / "new.key", live_key), (d / "new.pem", live_cert)):
            tmp = dst.with_suffix(".tmp")
            shutil.copy(src, tmp)
            os.replace(tmp, dst)
        from moebatch import ClientError
        deadline = time.time() + 20
        while True:
            try:
                client(daemon, tls_ca=d / "new-ca.pem").list_jobs_page()
                break
            except ClientError as e:
                assert e.code == grpc.StatusCode.UNAVAILABLE, e.message
                assert time.time() < deadline, f"renewed certificate not picked up: {e.message}"
                time.sleep(0.5)
        fresh = client(daemon, tls_ca=d / "new-ca.pem")
        assert [j.id for j in fresh.list_jobs()] == [job.id]
        code, _ = code_of(lambda: client(daemon, tls_ca=d / "old-ca.pem").list_jobs_page())
        assert code == grpc.StatusCode.UNAVAILABLE
        assert daemon.proc.poll() is None
    finally:
        daemon.stop()
