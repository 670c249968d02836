"""The Prometheus endpoint of a real moebatchd (--metrics_listen), scraped over HTTP after a job:
jobs by state, results, tokens, passes and the pass-time histogram, KV blocks, readiness."""
import json
import re
import shutil
import subprocess
import urllib.request

from conftest import MODEL, Daemon, free_port

GOLDEN = [json.loads(l) for l in open(MODEL / "golden.jsonl")]


def scrape_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def scrape(port: int) -> dict[str, float]:
    text = scrape_text(port)
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_endpoint_counts_a_job(tmp_path):
    port = free_port()
    d = Daemon(tmp_path / "data", ["--metrics_listen", f"127.0.0.1:{port}"]).start()
    try:
        from moebatch import Client
        c = Client(d.addr, timeout=30)
        before = scrape(port)
        assert before["moebatch_ready"] == 1
        requests = [{"custom_id": f"g{i}", "method": "POST", "url": "/v1/completions",
                     "body": {"prompt": g["prompt_token_ids"], "temperature": 0,
                              "max_tokens": len(g["greedy_token_ids"]), "ignore_eos": True}}
                    for i, g in enumerate(GOLDEN)]
        # One request too long for the context: failed at CreateJob, counted as failed.
        requests.append({"custom_id": "long", "method": "POST", "url": "/v1/completions",
                         "body": {"prompt": [1] + [100] * 5000, "max_tokens": 4}})
        job = c.create_job(requests=requests)
        c.wait(job.id)
        m = scrape(port)
        n = len(GOLDEN)
        assert m['moebatch_requests_total{outcome="completed"}'] == n
        assert m['moebatch_requests_total{outcome="failed"}'] == 1
        generated = sum(len(g["greedy_token_ids"]) for g in GOLDEN)
        assert m["moebatch_completion_tokens_total"] == generated
        assert m["moebatch_prompt_tokens_total"] == sum(len(g["prompt_token_ids"]) for g in GOLDEN)
        assert m['moebatch_jobs{state="completed"}'] == 1
        assert m['moebatch_jobs{state="in_progress"}'] == 0
        passes = m["moebatch_engine_passes_total"]
        assert passes > 0
        assert m["moebatch_pass_duration_seconds_count"] == passes
        assert m["moebatch_decode_tokens_total"] > 0
        assert any(re.match(r'moebatch_kv_blocks\{state="free"\}', k) for k in m)
        assert m['moebatch_kv_blocks{state="used"}'] == 0  # every sequence finished
        assert m['moebatch_busy_seconds_total{unit="cpu_attention"}'] > 0
    finally:
        d.stop()
    assert d.proc.returncode == 0


def test_promtool_accepts_the_exposition(tmp_path):
    """Prometheus' own linter (promtool, Debian's prometheus package, installed by
    scripts/test.sh) passes the daemon's metrics: names, units, types, help."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not installed (Debian package prometheus; scripts/test.sh installs it)"
    port = free_port()
    d = Daemon(tmp_path / "data", ["--metrics_listen", f"127.0.0.1:{port}"]).start()
    try:
        from moebatch import Client
        c = Client(d.addr, timeout=30)
        job = c.create_job(requests=[{"custom_id": "a", "method": "POST",
                                      "url": "/v1/completions",
                                      "body": {"prompt": [1, 2], "max_tokens": 2}}])
        c.wait(job.id)
        text = scrape_text(port)
    finally:
        d.stop()
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), \
        out.stdout + out.stderr
