"""The client and CLI end to end over loopback against a fake in-process BatchService
(conftest.py): the calls they make, streaming, and the mapping of gRPC errors."""
import io
import json
import socket

import grpc
import pytest

from moebatch import Client, ClientError, chat_request, cli, completion_request
from moebatch.v1 import batch_pb2 as pb

JSONL = "\n".join(json.dumps({
    "custom_id": f"alpaca-{i:04d}", "method": "POST", "url": "/v1/chat/completions",
    "body": {"messages": [{"role": "user", "content": f"question {i} \u00e9"}],
             "max_tokens": 8, "temperature": 0}}) for i in range(3)) + "\n"


def calls(service, name):
    return [request for method, request in service.calls if method == name]


# -- the API ----------------------------------------------------------------------------------

def test_create_job_dict_requests_go_as_jsonl(client, fake_server):
    _, service = fake_server
    job = client.create_job(
        requests=[chat_request("a", "Hello", max_tokens=4, temperature=0),
                  completion_request("b", [1, 2, 3], seed=9),
                  {"custom_id": "c", "prompt": "Once", "stop": ["\n"]},
                  pb.BatchRequest(custom_id="d", prompt="mixed in")],
        metadata={"run": "unit"}, model="tiny-mixtral")
    assert job.id == "job_0001" and job.state == pb.JOB_STATE_IN_PROGRESS
    assert job.request_counts.total == 4 and dict(job.metadata) == {"run": "unit"}
    (sent,) = calls(service, "CreateJob")
    assert sent.WhichOneof("source") == "jsonl" and sent.model == "tiny-mixtral"
    a, b, c, d = [json.loads(x) for x in sent.jsonl.decode().splitlines()]
    assert a == {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
                          "temperature": 0}}
    assert b["url"] == "/v1/completions" and b["body"] == {"prompt": [1, 2, 3], "seed": 9}
    assert c["url"] == "/v1/completions" and c["body"] == {"prompt": "Once", "stop": ["\n"]}
    assert d["custom_id"] == "d" and d["body"] == {"prompt": "mixed in"}


def test_create_job_messages_alone_go_inline(client, fake_server):
    _, service = fake_server
    message = pb.BatchRequest(custom_id="m", prompt="p")
    message.sampling.temperature = 500  # unchecked: the daemon's own validation
    client.create_job(requests=[message])
    (sent,) = calls(service, "CreateJob")
    assert sent.WhichOneof("source") == "requests"
    assert sent.requests.requests[0].sampling.temperature == 500


def test_bad_fields_are_the_daemons_to_refuse(client, fake_server):
    """Out-of-range values are sent as given; the daemon's INVALID_ARGUMENT, listing every bad
    line, is what the caller gets."""
    _, service = fake_server
    service.line_errors = {
        "b": "body.temperature: must be in [0, 100], got 101",
        "d": "body.messages[0].role: must be one of system, user, assistant, got \"bot\"",
    }
    with pytest.raises(ClientError) as info:
        client.create_job(requests=[
            chat_request("a", "fine"),
            chat_request("b", "hot", temperature=101),
            completion_request("c", "fine"),
            {"custom_id": "d", "messages": [{"role": "bot", "content": "x"}]}])
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message == (
        '2 of 4 lines are invalid: line 2 (custom_id "b"): body.temperature: must be in [0, 100], '
        'got 101; line 4 (custom_id "d"): body.messages[0].role: must be one of system, user, '
        'assistant, got "bot"')
    (sent,) = calls(service, "CreateJob")
    lines = [json.loads(x) for x in sent.jsonl.decode().splitlines()]
    assert lines[1]["body"]["temperature"] == 101
    assert lines[3]["body"]["messages"][0]["role"] == "bot"


def test_cli_reports_the_daemons_refusal(fake_server, tmp_path, capsys):
    address, service = fake_server
    service.line_errors = {"x": "body.top_p: must be in (0, 1], got 5"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([
        json.dumps({"custom_id": "w", "method": "POST", "url": "/v1/completions",
                    "body": {"prompt": "p"}}),
        "",
        json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions",
                    "body": {"prompt": "p", "top_p": 5}})]) + "\n")
    assert cli.main(["--server", address, "submit", str(bad)]) == 1
    assert capsys.readouterr().err == (
        'moebatch: INVALID_ARGUMENT: 1 of 2 lines is invalid: line 3 (custom_id "x"): '
        'body.top_p: must be in (0, 1], got 5\n')


def test_create_job_jsonl_and_path(client, fake_server, tmp_path):
    _, service = fake_server
    job = client.create_job(jsonl=JSONL)
    assert job.request_counts.total == 3
    path = tmp_path / "in.jsonl"
    path.write_text(JSONL, encoding="utf-8")
    job2 = client.create_job(path=path, metadata={"k": "v"})
    assert job2.id != job.id
    first, second = calls(service, "CreateJob")
    assert first.jsonl == JSONL.encode() and second.jsonl == JSONL.encode()  # sent verbatim
    assert dict(second.metadata) == {"k": "v"}


def test_create_job_argument_errors(client, tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        client.create_job()
    with pytest.raises(ValueError, match="exactly one"):
        client.create_job(requests=[], jsonl="x")
    with pytest.raises(ValueError, match=r"^requests\[0\]: body: give one of messages"):
        client.create_job(requests=[{"custom_id": "a", "messages": [], "prompt": "x"}])
    with pytest.raises(ValueError, match=r"^requests\[1\]: request: must be a dict"):
        client.create_job(requests=[{"custom_id": "a", "prompt": "x"}, "not a request"])
    with pytest.raises(ValueError, match="metadata"):
        client.create_job(jsonl=JSONL, metadata={"k": 1})


def test_server_refusal_is_a_client_error(client):
    with pytest.raises(ClientError) as info:
        client.create_job(jsonl="\n\n")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message == "requests: the job has no requests"
    with pytest.raises(ClientError, match="^INVALID_ARGUMENT: model: "):
        client.create_job(jsonl=JSONL, model="gpt-4")


def test_get_job_and_not_found(client, fake_server):
    _, service = fake_server
    service.add_job("job_a", total=5)
    assert client.get_job("job_a").request_counts.total == 5
    with pytest.raises(ClientError) as info:
        client.get_job("job_x")
    e = info.value
    assert e.code == grpc.StatusCode.NOT_FOUND and e.code_name == "NOT_FOUND"
    assert e.message == "job job_x not found"
    assert str(e) == "NOT_FOUND: job job_x not found"


def test_list_jobs_iterates_pages_and_filters(client, fake_server):
    _, service = fake_server
    for i in range(5):
        service.add_job(f"job_{i}", created_at=1000 + i,
                        state=pb.JOB_STATE_COMPLETED if i % 2 else pb.JOB_STATE_IN_PROGRESS)
    assert [j.id for j in client.list_jobs(page_size=2)] == [f"job_{i}" for i in (4, 3, 2, 1, 0)]
    pages = calls(service, "ListJobs")
    assert [(p.page_size, p.page_token) for p in pages] == [(2, ""), (2, "2"), (2, "4")]
    assert all(p.state == pb.JOB_STATE_UNSPECIFIED for p in pages)
    assert [j.id for j in client.list_jobs(state="completed")] == ["job_3", "job_1"]
    assert calls(service, "ListJobs")[-1].state == pb.JOB_STATE_COMPLETED
    assert [j.id for j in client.list_jobs(page_size=2, limit=3)] == ["job_4", "job_3", "job_2"]
    with pytest.raises(ValueError, match="state: must be one of"):
        client.list_jobs(state="running")


def test_cancel(client, fake_server):
    _, service = fake_server
    service.add_job("job_c")
    assert client.cancel("job_c").state == pb.JOB_STATE_CANCELLED
    assert calls(service, "CancelJob")[0].job_id == "job_c"
    with pytest.raises(ClientError, match="^NOT_FOUND: job job_zz not found$"):
        client.cancel("job_zz")


def test_watch_streams_progress(client, fake_server):
    _, service = fake_server
    service.add_job("job_w", total=3)
    progress = list(client.watch("job_w"))
    assert [p.request_counts.completed for p in progress] == [0, 1, 2, 3, 3]
    assert progress[-1].state == pb.JOB_STATE_COMPLETED
    assert progress[2].tokens_per_second == 200.0 and progress[2].eta_seconds == 1.0
    with pytest.raises(ClientError, match="^NOT_FOUND: job job_none not found$"):
        list(client.watch("job_none"))


def test_stream_error_mid_way(client, fake_server):
    _, service = fake_server
    service.add_job("job_broken", total=3)
    stream = client.watch("job_broken")
    assert next(stream).request_counts.completed == 0
    with pytest.raises(ClientError) as info:
        next(stream)
    assert info.value.code == grpc.StatusCode.INTERNAL and info.value.message == "boom"


def test_breaking_off_a_stream_cancels_it(client, fake_server):
    _, service = fake_server
    service.add_job("job_endless")
    stream = client.watch("job_endless")
    for _, _progress in zip(range(3), stream):
        pass
    stream.close()
    assert service.stream_cancelled.wait(timeout=10)


def test_results_in_order(client, fake_server):
    _, service = fake_server
    job = client.create_job(jsonl=JSONL)
    lines = list(client.results(job.id))
    assert [line["custom_id"] for line in lines] == ["alpaca-0000", "alpaca-0001", "alpaca-0002"]
    assert lines[1]["response"]["body"]["choices"][0]["token_ids"] == [101, 7]
    assert calls(service, "GetResults")[-1].wait is True
    assert [r.index for r in client.result_messages(job.id, wait=False)] == [0, 1]
    assert calls(service, "GetResults")[-1].wait is False


def test_wait_returns_the_final_job_and_survives_unavailable(client, fake_server):
    _, service = fake_server
    service.add_job("job_flaky", total=2)
    seen = []
    job, last = client.wait("job_flaky", on_progress=seen.append, reconnect_timeout=10)
    assert job.state == pb.JOB_STATE_COMPLETED and job.request_counts.completed == 2
    assert last.state == pb.JOB_STATE_COMPLETED and len(seen) == 4
    assert len(calls(service, "WatchJob")) == 2  # the first answered UNAVAILABLE


def test_unary_deadline(fake_server):
    address, service = fake_server
    service.add_job("job_slow")
    with Client(address, timeout=0.2) as c:
        with pytest.raises(ClientError) as info:
            c.get_job("job_slow")
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_daemon_is_unavailable():
    with Client(f"127.0.0.1:{_free_port()}", timeout=5) as c:
        with pytest.raises(ClientError) as info:
            c.get_job("job_1")
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(ClientError, match="^UNAVAILABLE: moebatchd at .* not serving"):
            c.wait_ready(timeout=0.2)


def test_wait_ready(client):
    client.wait_ready(timeout=10)


def test_wait_ready_waits_while_the_model_loads(client, fake_server):
    _, service = fake_server
    service.loading_checks = 3
    client.wait_ready(timeout=10)
    assert service.loading_checks == 0
    service.loading_checks = 1000
    with pytest.raises(ClientError, match="loading its model"):
        client.wait_ready(timeout=0.3)


# -- the CLI ----------------------------------------------------------------------------------

@pytest.fixture
def jsonl_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(JSONL, encoding="utf-8")
    return path


def test_cli_submit_wait_status_results_list(fake_server, jsonl_file, tmp_path, capsys):
    address, service = fake_server
    rc = cli.main(["--server", address, "submit", str(jsonl_file), "--wait",
                   "--metadata", "run=unit", "--metadata", "note=a=b"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    job = json.loads(out)
    assert job["id"] == "job_0001" and job["state"] == "completed"
    assert job["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert job["metadata"] == {"note": "a=b", "run": "unit"}
    assert "moebatch: submitted job_0001 (3 requests)" in err
    assert "job_0001 in_progress 0/3 done (0 failed)" in err  # progress (stderr is no tty here)
    assert "moebatch: job_0001 completed: 3 completed, 0 failed of 3 requests" in err
    assert "123.5 tok/s" in err

    assert cli.main(["status", "job_0001", "--server", address]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "completed"

    out_path = tmp_path / "results.jsonl"
    assert cli.main(["--server", address, "results", "job_0001", "-o", str(out_path)]) == 0
    assert "wrote 3 results" in capsys.readouterr().err
    lines = out_path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["custom_id"] for x in lines] == [f"alpaca-000{i}" for i in range(3)]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".moebatch-results-")]

    assert cli.main(["--server", address, "results", "job_0001", "--no-wait"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2

    service.add_job("job_old", created_at=5, state=pb.JOB_STATE_CANCELLED)
    assert cli.main(["--server", address, "list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ID", "STATE", "DONE/TOTAL", "FAILED", "CREATED"]
    assert [row.split()[:3] for row in table[1:]] == [
        ["job_0001", "completed", "3/3"], ["job_old", "cancelled", "0/3"]]
    assert cli.main(["--server", address, "list", "--state", "cancelled", "--json"]) == 0
    assert [json.loads(x)["id"] for x in capsys.readouterr().out.splitlines()] == ["job_old"]


def test_cli_submit_without_wait_and_cancel(fake_server, jsonl_file, capsys):
    address, _ = fake_server
    assert cli.main(["--server", address, "submit", str(jsonl_file)]) == 0
    job = json.loads(capsys.readouterr().out)
    assert job["state"] == "in_progress"
    assert cli.main(["--server", address, "cancel", job["id"]]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "cancelled"


def test_cli_server_errors_exit_1(fake_server, tmp_path, capsys, monkeypatch):
    address, _ = fake_server
    monkeypatch.setenv("MOEBATCH_SERVER", address)  # the default --server
    for argv in (["status", "job_x"], ["cancel", "job_x"],
                 ["results", "job_x", "-o", str(tmp_path / "r.jsonl")]):
        assert cli.main(argv) == 1
        assert capsys.readouterr().err == "moebatch: NOT_FOUND: job job_x not found\n"
    assert not list(tmp_path.iterdir())  # no partial results file
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert cli.main(["submit", str(empty)]) == 1
    assert capsys.readouterr().err == (
        "moebatch: INVALID_ARGUMENT: requests: the job has no requests\n")


@pytest.mark.parametrize("outcome, message", [
    ("cancelled", "moebatch: job job_0001 was cancelled\n"),
    ("failed", "moebatch: job job_0001 failed: engine exploded\n"),
])
def test_cli_waited_job_ending_badly_exits_1(fake_server, jsonl_file, capsys, outcome, message):
    address, _ = fake_server
    rc = cli.main(["--server", address, "submit", str(jsonl_file), "--wait", "--no-progress",
                   "--metadata", f"fake_outcome={outcome}"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert json.loads(out)["state"] == outcome
    assert err.endswith(message)
    assert "in_progress" not in err  # --no-progress


def test_progress_display_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    display = cli.ProgressDisplay("job_t", stream)
    for done in range(4):
        display.update(pb.JobProgress(
            job_id="job_t", state=pb.JOB_STATE_IN_PROGRESS,
            request_counts=pb.RequestCounts(total=3, completed=done),
            tokens_per_second=50.0, eta_seconds=65.0 if done < 3 else 0.0))
    display.close()
    text = stream.getvalue()
    assert "job_t in_progress" in text and "3/3" in text
    assert "50.0 tok/s" in text and "ETA 1:05" in text


def test_format_duration():
    assert cli.format_duration(0) == "0:00"
    assert cli.format_duration(65.4) == "1:05"
    assert cli.format_duration(3725) == "1:02:05"
