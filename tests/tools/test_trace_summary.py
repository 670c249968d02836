#!/usr/bin/env python3
"""scripts/trace_summary.py on a real trace (run by ctest; plain python3).

Runs moebatch-run on the tiny golden Mixtral with --trace_file (4 completions of 24-40 prompt
tokens, 6 generated each: prefill and decode passes), summarises the trace, and checks the table
against the trace itself: one row per pass-size group, the groups' passes and tokens summing to
the trace's pass events and tokens, the shares of pass time summing to 100%, every part share in
[0, 100%], the roofline columns filled. Then checks that a file that is not a trace, and a bad
--groups, exit with status 2 and a message.

Usage: test_trace_summary.py MOEBATCH_RUN FIXTURES_DIR SCRIPTS_DIR
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    runner, fixtures, scripts = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    summary = [sys.executable, str(scripts / "trace_summary.py")]
    with tempfile.TemporaryDirectory() as tmp:
        inp, out, trace = Path(tmp, "in.jsonl"), Path(tmp, "out.jsonl"), Path(tmp, "trace.json")
        with open(inp, "w") as f:
            for i, n in enumerate([24, 31, 40, 33]):
                f.write(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                    "url": "/v1/completions",
                                    "body": {"prompt": [100 + (i * 7 + t) % 200 for t in range(n)],
                                             "max_tokens": 6, "temperature": 0,
                                             "ignore_eos": True}}) + "\n")
        run = subprocess.run([runner, "--model", str(fixtures / "tiny-mixtral"), "--input",
                              str(inp), "--output", str(out), "--trace_file", str(trace),
                              "--progress=false", "--log_level=warn"],
                             capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stderr
        events = json.loads(trace.read_text())["traceEvents"]
        passes = [e for e in events if e.get("ph") == "X" and e["tid"] == 3]
        assert passes, "the trace has no pass events"
        res = subprocess.run(summary + [str(trace), "--groups", "1,8,63"], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        rows = [line.split("|")[1:-1] for line in res.stdout.splitlines()[2:]]
        assert rows, res.stdout
        cells = [[c.strip() for c in r] for r in rows]
        assert sum(int(c[1]) for c in cells) == len(passes), res.stdout
        assert sum(int(c[2]) for c in cells) == sum(p["args"]["tokens"] for p in passes), res.stdout
        share = sum(float(c[4].rstrip("%")) for c in cells)
        assert abs(share - 100.0) < 0.5, res.stdout
        for c in cells:
            parts = [float(v.rstrip("%")) for v in c[6:11]]
            assert all(-0.5 <= p <= 100.5 for p in parts), res.stdout
            assert c[11] != "-" and float(c[12]) > 0, res.stdout  # the engine's roofline
        print(res.stdout)

        bad = Path(tmp, "bad.json")
        bad.write_text("{\"not\": \"a trace\"}")
        res = subprocess.run(summary + [str(bad)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "not a Chrome trace" in res.stderr, res
        res = subprocess.run(summary + [str(trace), "--groups", "1,x"], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 2 and "--groups" in res.stderr, res
    print("trace_summary: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
