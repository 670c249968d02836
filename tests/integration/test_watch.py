"""`moebatch watch` and `moebatch status` against a real moebatchd on loopback: a second process
follows a job it did not submit, sees tokens progress before any request has finished, and reads
the daemon's job-clock rate (sub-second: a job shorter than a second has a rate above 0); the
daemon's completion log line says the same; after a restart the store's figures stand in.
The Go twin (`moebatch-go watch`) is in test_go_client.py."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from conftest import Daemon

CLI = Path(sys.executable).parent / "moebatch"

# "in_progress 0/8 done (0 failed), 1234/12000 tokens, 10%, 456.7 tok/s, 0:03 elapsed, ETA 0:27"
PROGRESS = re.compile(r"(\w+) (\d+)/(\d+) done \((\d+) failed\), (\d+)/(\d+) tokens, (\d+)%, "
                      r"([\d.]+) tok/s, ([\d:]+) elapsed, ETA (\S+)$")


def chat_line(custom_id, text, max_tokens, **extra):
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **extra}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": body})


def moebatch(daemon, *args, timeout=300):
    return subprocess.run([str(CLI), "--server", daemon.addr, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def completion_log(daemon, job_id):
    """(seconds, tokens, tok/s) of the daemon's line "job J completed in S s: ... T tokens
    generated here, R tok/s"."""
    pattern = re.compile(rf"job {job_id} completed in ([\d.]+) s: .* (\d+) tokens generated "
                         r"here, ([\d.]+) tok/s")
    for _ in range(50):
        found = pattern.search(daemon.log.read_text())
        if found:
            return float(found[1]), int(found[2]), float(found[3])
        time.sleep(0.1)
    raise AssertionError(f"no completion line for {job_id}: {daemon.log.read_text()[-2000:]}")


def test_watch_follows_a_job_submitted_elsewhere(daemon, client, tmp_path):
    # 8 requests of 1500 tokens run side by side: several seconds during which no request is
    # done, yet tokens are generated.
    n, max_tokens = 8, 1500
    job = client.create_job(jsonl="\n".join(
        chat_line(f"r{i}", f"Tell me a story {i}", max_tokens, ignore_eos=True)
        for i in range(n)) + "\n")
    watch = moebatch(daemon, "watch", job.id, "--interval", "0.2")
    assert watch.returncode == 0, watch.stderr
    final = json.loads(watch.stdout)
    assert final["id"] == job.id and final["state"] == "completed"
    lines = watch.stderr.splitlines()
    assert lines[0] == f"moebatch: watching {job.id} ({n} requests)", lines[:3]
    progress = [PROGRESS.search(line) for line in lines if line.startswith(f"moebatch: {job.id} ")]
    progress = [m for m in progress if m]
    running = [m for m in progress if m[1] == "in_progress"]
    # Before any request was done, the token count, the bar's percentage and the rate moved.
    before = [m for m in running if m[2] == "0"]
    assert len(before) >= 2, watch.stderr
    tokens = [int(m[5]) for m in before]
    assert tokens == sorted(tokens) and tokens[-1] > tokens[0], watch.stderr
    assert all(int(m[6]) == n * max_tokens for m in progress)  # max_tokens_total
    assert int(before[-1][7]) > 0 and float(before[-1][8]) > 0, watch.stderr
    assert progress[-1][1] == "completed" and progress[-1][7] == "100", watch.stderr
    # The summary: the daemon's job clock, its rate, and the tokens.
    summary = re.search(rf"moebatch: {job.id} completed: {n} completed, 0 failed of {n} requests "
                        r"in ([\d.]+)s; \d+ prompt tokens, (\d+) generated tokens, ([\d.]+) tok/s",
                        watch.stderr)
    assert summary, watch.stderr
    assert int(summary[2]) == n * max_tokens and float(summary[3]) > 0
    # The completion log line holds the same reading as the final JobProgress and Job.
    seconds, generated, rate = completion_log(daemon, job.id)
    assert generated == n * max_tokens
    assert rate == round(final["tokens_per_second"], 1) == float(summary[3])
    assert abs(seconds - final["elapsed_seconds"]) < 0.001
    assert abs(rate - generated / seconds) <= 1e-3 * rate + 0.05  # seconds logged to the ms


def test_a_short_job_has_a_rate_and_status_shows_it(daemon, client, tmp_path):
    job = client.create_job(jsonl=chat_line("short", "Hi", 4, ignore_eos=True) + "\n")
    t0 = time.time()
    while client.get_job(job.id).state != 4:  # JOB_STATE_COMPLETED
        assert time.time() - t0 < 60
        time.sleep(0.05)
    # Watching a finished job prints its final state at once.
    started = time.monotonic()
    watch = moebatch(daemon, "watch", job.id)
    assert watch.returncode == 0, watch.stderr
    assert time.monotonic() - started < 10
    assert "watching" not in watch.stderr and "in_progress" not in watch.stderr
    final = json.loads(watch.stdout)
    # Shorter than a second: whole seconds from started_at gave 0 tok/s; the job clock does not.
    assert 0 < final["elapsed_seconds"] < 1, final
    assert final["elapsed_seconds"] != int(final["elapsed_seconds"])
    assert final["generated_tokens"] == 4
    assert final["tokens_per_second"] > 0
    assert abs(final["tokens_per_second"] - 4 / final["elapsed_seconds"]) < 1e-6 * \
        final["tokens_per_second"]
    status = moebatch(daemon, "status", job.id)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == final
    # The summary: start time in local time (from the job clock: the end less the elapsed
    # time; the store's started_at is the first result's), token counts, the daemon's rate.
    start = max(int(final["finished_at"] - final["elapsed_seconds"]), final["created_at"])
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))
    zone = time.strftime("%Z", time.localtime(start))
    assert status.stderr == (
        f"moebatch: {job.id} completed: 1/1 done (0 failed); started {local} {zone}, "
        f"ran {final['elapsed_seconds']:.2f}s, finished "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(final['finished_at']))} {zone}; "
        f"{final['prompt_tokens']} prompt tokens, 4 generated tokens, "
        f"{final['tokens_per_second']:.1f} tok/s\n"), status.stderr
    seconds, generated, rate = completion_log(daemon, job.id)
    assert generated == 4 and rate == round(final["tokens_per_second"], 1) and rate > 0

    # Cancelled: watch exits 1, as submit --wait does.
    long = client.create_job(jsonl=chat_line("long", "Go on", 3000, ignore_eos=True) + "\n")
    client.cancel(long.id)
    cancelled = moebatch(daemon, "watch", long.id)
    assert cancelled.returncode == 1
    assert cancelled.stderr.endswith(f"moebatch: job {long.id} was cancelled\n")
    missing = moebatch(daemon, "watch", "job_nope")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr

    # After a restart the job clock is gone: the store's whole seconds stand in.
    daemon.stop()
    again = Daemon(daemon.data_dir).start()
    try:
        status = moebatch(again, "status", job.id)
        assert status.returncode == 0, status.stderr
        stored = json.loads(status.stdout)
        whole = stored["finished_at"] - stored["started_at"]
        assert stored["elapsed_seconds"] == whole
        assert stored["tokens_per_second"] == (4 / whole if whole > 0 else 0)
        watch = moebatch(again, "watch", job.id, "--no-progress")
        assert watch.returncode == 0 and json.loads(watch.stdout) == stored
    finally:
        again.stop()
