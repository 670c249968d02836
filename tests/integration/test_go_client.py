"""The Go client (client/go) end to end: its CLI `moebatch-go` drives a real moebatchd on loopback.

The binary is $MOEBATCH_GO_CLIENT when set (scripts/test.sh builds it with client/go/build.sh);
otherwise these tests build it with `client/go/build.sh --no-test` into a temporary directory.
Without a Go toolchain they are skipped, except in CI ($CI set), where build.sh installs Debian's
Go packages and any failure fails the tests.
"""
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BUILD, MODEL, ROOT, Daemon, free_port

GOLDEN = [json.loads(l) for l in open(MODEL / "golden.jsonl")]


@pytest.fixture(scope="session")
def go_cli(tmp_path_factory) -> Path:
    given = os.environ.get("MOEBATCH_GO_CLIENT")
    if given:
        path = Path(given)
        assert path.is_file() and os.access(path, os.X_OK), \
            f"MOEBATCH_GO_CLIENT={given} is not an executable file"
        return path
    if shutil.which("go") is None and not os.environ.get("CI"):
        pytest.skip("no Go toolchain: install it with client/go/build.sh (Debian's golang-go), or "
                    "point MOEBATCH_GO_CLIENT at a built moebatch-go; in CI ($CI set) this fails")
    out = tmp_path_factory.mktemp("go-client")
    build = subprocess.run([str(ROOT / "client" / "go" / "build.sh"), "--no-test", str(out)],
                           capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, \
        f"client/go/build.sh failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}"
    return out / "moebatch-go"


def run(cli, *args, env=None, timeout=180):
    """Runs moebatch-go with a clean environment (no MOEBATCH_* from the caller's shell)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MOEBATCH_")}
    full_env.update(env or {})
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def golden_line(i):
    g = GOLDEN[i]
    return json.dumps({"custom_id": f"golden-{i}", "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": g["prompt_token_ids"], "temperature": 0,
                                "max_tokens": len(g["greedy_token_ids"]), "ignore_eos": True}})


def chat_line(custom_id, text, **body):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": text}], **body}})


def test_submit_wait_results_status_list(go_cli, daemon, tmp_path):
    lines = [golden_line(i) for i in range(len(GOLDEN))] + \
        [chat_line("chat-0", "Hello", max_tokens=8, temperature=0)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    # Flags after the file, as with the Python CLI.
    sub = run(go_cli, "submit", src, "--wait", "--metadata", "team=go", "--server", daemon.addr)
    assert sub.returncode == 0, sub.stderr
    job = json.loads(sub.stdout)
    n = len(lines)
    assert job["state"] == "completed"
    assert job["request_counts"] == {"total": n, "completed": n, "failed": 0}
    assert job["metadata"] == {"team": "go"}
    assert job["finished_at"] >= job["created_at"] > 0
    assert f"moebatch-go: submitted {job['id']} ({n} requests)" in sub.stderr
    assert f"moebatch-go: {job['id']} completed: {n} completed, 0 failed of {n} requests" \
        in sub.stderr

    # results -o: the golden greedy tokens, in input order.
    out = tmp_path / "out.jsonl"
    res = run(go_cli, "--server", daemon.addr, "results", job["id"], "-o", out)
    assert res.returncode == 0, res.stderr
    assert f"wrote {n} results to {out}" in res.stderr
    results = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == [json.loads(l)["custom_id"] for l in lines]
    for i, g in enumerate(GOLDEN):
        choice = results[i]["response"]["body"]["choices"][0]
        assert choice["token_ids"] == g["greedy_token_ids"], f"golden-{i}"
        assert choice["text"] == g["greedy_text"]
    assert results[-1]["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".moebatch-results-")]
    # ... and on stdout the same lines; the server address from $MOEBATCH_SERVER.
    env = {"MOEBATCH_SERVER": daemon.addr}
    res = run(go_cli, "results", job["id"], "--no-wait", env=env)
    assert res.returncode == 0 and res.stdout == out.read_text()
    assert res.stderr == f"moebatch-go: {n} results\n"

    status = run(go_cli, "status", job["id"], env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == job

    listing = run(go_cli, "list", env=env)
    assert listing.returncode == 0, listing.stderr
    header, row = listing.stdout.splitlines()
    assert header.split() == ["ID", "STATE", "DONE/TOTAL", "FAILED", "CREATED"]
    assert row.split()[:4] == [job["id"], "completed", f"{n}/{n}", "0"]
    as_json = run(go_cli, "list", "--json", "--state", "completed", env=env)
    assert as_json.returncode == 0
    assert [json.loads(l) for l in as_json.stdout.splitlines()] == [job]
    none = run(go_cli, "list", "--state", "cancelled", "--json", env=env)
    assert none.returncode == 0 and none.stdout == ""


def test_cancel_while_waiting(go_cli, daemon, tmp_path):
    src = tmp_path / "long.jsonl"
    src.write_text("\n".join(
        chat_line(f"r{i}", f"Tell me a story {i}", max_tokens=2000, temperature=0.8, seed=i,
                  ignore_eos=True) for i in range(8)) + "\n")
    env = {"MOEBATCH_SERVER": daemon.addr}
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MOEBATCH_")}
    waiter = subprocess.Popen([str(go_cli), "submit", str(src), "--wait"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**full_env, **env})
    try:
        first = waiter.stderr.readline()  # "moebatch-go: submitted job_... (8 requests)"
        assert first.startswith("moebatch-go: submitted ") and first.endswith(" (8 requests)\n"), \
            first
        job_id = first.split()[2]
        status = run(go_cli, "status", job_id, env=env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["state"] == "in_progress"
        time.sleep(1)  # let the engine start on it
        t0 = time.time()
        cancel = run(go_cli, "cancel", job_id, env=env)
        assert cancel.returncode == 0, cancel.stderr
        assert json.loads(cancel.stdout)["state"] in ("cancelling", "cancelled")
        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    # The waiting submit sees the cancel: exit 1, the final job on stdout.
    assert waiter.returncode == 1, err
    assert err.endswith(f"moebatch-go: job {job_id} was cancelled\n"), err
    final = json.loads(out)
    assert final["state"] == "cancelled" and final["request_counts"]["completed"] < 8
    assert time.time() - t0 < 30
    again = run(go_cli, "cancel", job_id, env=env)  # a no-op on a finished job
    assert again.returncode == 0 and json.loads(again.stdout)["state"] == "cancelled"
    # Every request has a line; those the cancel dropped say so.
    partial = run(go_cli, "results", job_id, env=env)
    assert partial.returncode == 0
    lines = [json.loads(l) for l in partial.stdout.splitlines()]
    assert len(lines) == final["request_counts"]["total"]
    dropped = [l for l in lines if (l.get("error") or {}).get("code") == "batch_cancelled"]
    assert len(dropped) == final["request_counts"]["total"] - \
        final["request_counts"]["completed"] - final["request_counts"]["failed"] > 0
    cancelled = run(go_cli, "list", "--json", "--state", "cancelled", env=env)
    assert [json.loads(l)["id"] for l in cancelled.stdout.splitlines()] == [job_id]


@pytest.mark.parametrize("bad_lines, message", [
    ([golden_line(0), json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/completions",
                                  "body": {"prompt": "x", "max_tokens": 0}})],
     'line 2 (custom_id "b"): body.max_tokens'),
    ([golden_line(0), golden_line(1), "{not json"], "line 3: invalid JSON"),
    ([chat_line("dup", "a"), chat_line("dup", "b")], 'line 2 (custom_id "dup"): custom_id'),
    ([json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                  "body": {"prompt": "x"}})], 'line 1 (custom_id "a"): url'),
])
def test_bad_request_names_the_line(go_cli, daemon, tmp_path, bad_lines, message):
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join(bad_lines) + "\n")
    sub = run(go_cli, "--server", daemon.addr, "submit", src, "--wait")
    assert sub.returncode == 1
    assert sub.stderr.startswith("moebatch-go: INVALID_ARGUMENT: "), sub.stderr
    assert message in sub.stderr.splitlines()[0], sub.stderr
    assert sub.stdout == ""
    listing = run(go_cli, "--server", daemon.addr, "list", "--json")
    assert listing.returncode == 0 and listing.stdout == ""  # nothing half-created


def test_unknown_job_is_not_found(go_cli, daemon):
    for command in ("status", "results", "cancel"):
        r = run(go_cli, command, "job_doesnotexist", "--server", daemon.addr)
        assert r.returncode == 1, (command, r.stderr)
        assert r.stderr.startswith("moebatch-go: NOT_FOUND: "), (command, r.stderr)
        assert "job_doesnotexist" in r.stderr and r.stdout == ""


def test_usage_errors_and_no_daemon(go_cli, tmp_path):
    for args in ([], ["frobnicate"], ["status"], ["list", "--state", "done"],
                 ["submit", tmp_path / "missing.jsonl"]):
        r = run(go_cli, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("moebatch-go: ") and r.stdout == "", (args, r.stderr)
    assert run(go_cli, "--help").returncode == 0
    down = run(go_cli, "--server", f"127.0.0.1:{free_port()}", "--timeout", "5", "status", "job_1")
    assert down.returncode == 1 and down.stderr.startswith("moebatch-go: UNAVAILABLE: "), \
        down.stderr


def test_token_is_sent_over_plaintext(go_cli, daemon):
    # A daemon without a tokens file ignores the token; the call must still work over plaintext
    # (the client's per-call credentials do not demand TLS).
    r = run(go_cli, "list", "--server", daemon.addr, env={"MOEBATCH_TOKEN": "some-token"})
    assert r.returncode == 0, r.stderr
    r = run(go_cli, "list", "--server", daemon.addr, "--token", "another-token")
    assert r.returncode == 0, r.stderr


# -- authentication and TLS -----------------------------------------------------------------------

def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_certs(d: Path):
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate, by openssl."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                  "extendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.pem", cwd=d)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")
def test_token_and_mutual_tls(go_cli, tmp_path):
    token = "go-client-test-token"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"sha256": hashlib.sha256(token.encode()).hexdigest(), "tenant": "team-go",
         "role": "user"}]}))
    certs = tmp_path / "certs"
    certs.mkdir()
    _make_certs(certs)
    d = Daemon(tmp_path / "data", extra_args=[
        "--tokens_file", str(tokens), "--tls_cert", str(certs / "server.pem"),
        "--tls_key", str(certs / "server.key"), "--tls_client_ca", str(certs / "ca.pem")],
        tls_ca=certs / "ca.pem", tls_client=(certs / "client.pem", certs / "client.key")).start()
    try:
        tls = ["--server", d.addr, "--tls-ca", certs / "ca.pem", "--tls-cert",
               certs / "client.pem", "--tls-key", certs / "client.key", "--timeout", "10"]
        src = tmp_path / "in.jsonl"
        src.write_text(golden_line(0) + "\n")
        sub = run(go_cli, "submit", src, "--wait", "--no-progress", *tls, "--token", token)
        assert sub.returncode == 0, sub.stderr
        job = json.loads(sub.stdout)
        assert job["state"] == "completed" and job["tenant"] == "team-go"
        res = run(go_cli, "results", job["id"], *tls, env={"MOEBATCH_TOKEN": token})
        assert json.loads(res.stdout)["response"]["body"]["choices"][0]["token_ids"] == \
            GOLDEN[0]["greedy_token_ids"]
        # No token, or a wrong one: UNAUTHENTICATED. No client certificate, or plaintext: no
        # connection (UNAVAILABLE).
        for env in ({}, {"MOEBATCH_TOKEN": "wrong"}):
            r = run(go_cli, "status", job["id"], *tls, env=env)
            assert r.returncode == 1 and r.stderr.startswith("moebatch-go: UNAUTHENTICATED: "), \
                r.stderr
        for args in (["--server", d.addr, "--tls-ca", certs / "ca.pem"], ["--server", d.addr]):
            r = run(go_cli, "status", job["id"], *args, "--timeout", "5",
                    env={"MOEBATCH_TOKEN": token})
            assert r.returncode == 1 and r.stderr.startswith("moebatch-go: UNAVAILABLE: "), \
                r.stderr
    finally:
        d.stop()


def test_watch_and_status(go_cli, daemon, tmp_path):
    """`moebatch-go watch` follows a job another process submitted: tokens progress before any
    request is done, the daemon's job-clock rate is above 0; `status` prints the same job and a
    summary with the local start time, tokens and rate."""
    import re

    from moebatch import Client

    # Long enough for several 0.2 s polls while it runs: 4 x 800 tokens took 0.5 s on a Zen 4 host.
    n, max_tokens = 4, 3000
    job = Client(daemon.addr, timeout=60).create_job(jsonl="\n".join(
        chat_line(f"r{i}", f"Tell me a story {i}", max_tokens=max_tokens, temperature=0,
                  ignore_eos=True) for i in range(n)) + "\n")
    env = {"MOEBATCH_SERVER": daemon.addr}
    watch = run(go_cli, "watch", job.id, "--interval", "0.2", env=env, timeout=600)
    assert watch.returncode == 0, watch.stderr
    final = json.loads(watch.stdout)
    assert final["state"] == "completed" and final["generated_tokens"] == n * max_tokens
    assert final["tokens_per_second"] > 0 and final["elapsed_seconds"] > 0
    assert watch.stderr.startswith(f"moebatch-go: watching {job.id} ({n} requests)\n")
    pattern = re.compile(rf"moebatch-go: {job.id} in_progress 0/{n} done \(0 failed\), "
                         rf"(\d+)/{n * max_tokens} tokens, (\d+)%, ([\d.]+) tok/s")
    before = [m for m in map(pattern.match, watch.stderr.splitlines()) if m]
    assert len(before) >= 2, watch.stderr
    tokens = [int(m[1]) for m in before]
    assert tokens == sorted(tokens) and tokens[-1] > tokens[0], watch.stderr
    assert int(before[-1][2]) > 0 and float(before[-1][3]) > 0, watch.stderr
    assert (f"moebatch-go: {job.id} completed: {n} completed, 0 failed of {n} requests in "
            f"{final['elapsed_seconds']:.2f}s;") in watch.stderr

    status = run(go_cli, "status", job.id, env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == final
    start = max(int(final["finished_at"] - final["elapsed_seconds"]), final["created_at"])
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))
    assert status.stderr.startswith(
        f"moebatch-go: {job.id} completed: {n}/{n} done (0 failed); started {local} "), \
        status.stderr
    assert status.stderr.endswith(
        f"; {final['prompt_tokens']} prompt tokens, {n * max_tokens} generated tokens, "
        f"{final['tokens_per_second']:.1f} tok/s\n"), status.stderr
