"""CLI argument parsing and usage errors (exit code 2); no daemon needed."""
import os
import socket
import subprocess
import sys

import pytest

from moebatch import cli
from moebatch.v1 import batch_pb2 as pb


def free_port():
    """A loopback port where nothing listens (for UNAVAILABLE)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(*argv):
    return cli.build_parser().parse_args(list(argv))


def test_submit_arguments():
    args = parse("submit", "in.jsonl", "--wait", "--metadata", "a=1", "--metadata", "b=x=y",
                 "--model", "tiny")
    assert args.command == "submit" and args.func is cli.cmd_submit
    assert args.file == "in.jsonl" and args.wait and not args.no_progress
    assert args.metadata == [("a", "1"), ("b", "x=y")]
    assert args.model == "tiny"
    assert not hasattr(args, "server")  # not given: resolved from the environment in main()


@pytest.mark.parametrize("argv", [
    ["--server", "h:1", "status", "job_1"],
    ["status", "job_1", "--server", "h:1"],
    ["status", "--server=h:1", "job_1"],
])
def test_server_before_or_after_the_command(argv):
    args = parse(*argv)
    assert args.server == "h:1" and args.job == "job_1"


def test_other_commands():
    args = parse("list", "--state", "in_progress", "--limit", "5", "--json")
    assert args.state == pb.JOB_STATE_IN_PROGRESS and args.limit == 5 and args.json
    assert parse("list", "--state", "COMPLETED").state == pb.JOB_STATE_COMPLETED
    assert parse("list").state is None
    args = parse("results", "job_1", "-o", "out.jsonl")
    assert args.output == "out.jsonl" and not args.no_wait
    assert parse("results", "job_1").output == "-"
    assert parse("results", "job_1", "--no-wait").no_wait
    assert parse("cancel", "job_2").job == "job_2"
    assert parse("--timeout", "2.5", "status", "j").timeout == 2.5


@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["submit"],
    ["submit", "a.jsonl", "b.jsonl"],
    ["submit", "a.jsonl", "--metadata", "novalue"],
    ["submit", "a.jsonl", "--metadata", "=v"],
    ["status"],
    ["list", "--state", "running"],
    ["list", "--limit", "0"],
    ["list", "--page-size", "x"],
    ["results", "job_1", "--output"],
    ["cancel"],
    ["--timeout", "0", "status", "j"],
    ["status", "j", "--bogus"],
])
def test_bad_usage_exits_2(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "usage: moebatch" in err and "error:" in err


def test_help_exits_0(capsys):
    assert cli.main(["--help"]) == 0
    assert "submit" in capsys.readouterr().out
    assert cli.main(["submit", "--help"]) == 0
    assert "--metadata" in capsys.readouterr().out


def test_unreadable_input_file_exits_2(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    # No daemon is needed: the file is read before any call.
    assert cli.main(["--server", "127.0.0.1:9", "submit", str(missing)]) == 2
    assert capsys.readouterr().err.startswith(f"moebatch: cannot read {missing}: ")


def test_results_into_missing_directory_exits_2(tmp_path, capsys):
    out = tmp_path / "nope" / "out.jsonl"
    assert cli.main(["--server", "127.0.0.1:9", "results", "job_1", "-o", str(out)]) == 2
    assert "no directory" in capsys.readouterr().err


def test_no_daemon_is_a_server_error(capsys):
    # Nothing listens there: UNAVAILABLE is exit code 1.
    assert cli.main(["--server", f"127.0.0.1:{free_port()}", "--timeout", "5",
                     "status", "job_1"]) == 1
    assert capsys.readouterr().err.startswith("moebatch: UNAVAILABLE: ")


def test_python_dash_m_and_env_server():
    address = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, MOEBATCH_SERVER=address)
    proc = subprocess.run([sys.executable, "-m", "moebatch", "list", "--state", "nope"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert "invalid _state value" not in proc.stderr
    assert "must be one of validating, in_progress" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "moebatch", "--timeout", "5", "status", "j"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert address in proc.stderr  # the address came from $MOEBATCH_SERVER


def test_ray_daemons_arguments_after_the_double_dash_go_to_moebatchd():
    args = cli.parse_args(["ray-daemons", "start", "--port", "0", "--gpus", "2", "--",
                           "--model", "/models/m.gguf", "--port", "9", "--"])
    assert args.func is cli.cmd_ray_daemons and args.action == "start"
    assert (args.port, args.gpus) == (0, 2.0)
    assert args.daemon_args == ["--model", "/models/m.gguf", "--port", "9", "--"]
    assert cli.parse_args(["ray-daemons", "list"]).daemon_args == []
    # `--` before the command is argparse's own.
    assert cli.parse_args(["status", "--", "job_1"]).job == "job_1"


@pytest.mark.parametrize("argv, message", [
    (["ray-daemons", "list", "--", "--model", "m"], "ray-daemons list takes no moebatchd"),
    (["ray-daemons", "start", "--port", "70000"], "--port: must be in [0, 65535]"),
    (["ray-daemons", "start", "--gpus", "0"], "must be a positive number"),
    (["ray-daemons", "restart"], "invalid choice"),
])
def test_ray_daemons_usage_errors_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
