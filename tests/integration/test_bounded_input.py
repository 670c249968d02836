"""User values a real moebatchd must not echo whole, and the metadata it must refuse: a 300 KB
duplicate custom_id, a 300 KB body.model (with --check_model) and a 100 KB job id get their own error
(INVALID_ARGUMENT, NOT_FOUND), not gRPC's RESOURCE_EXHAUSTED for a status message over its 16 KiB
metadata limit; job metadata is held to OpenAI's limits (16 pairs, keys of 1-64 characters, values
up to 512, no NUL)."""
import grpc
import pytest

from conftest import Daemon
from moebatch import Client, ClientError


def line(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0, **body}}


def error_of(fn):
    with pytest.raises(ClientError) as e:
        fn()
    return e.value.code, e.value.message


def test_body_model_is_accepted_unless_check_model_and_then_quoted_bounded(client, tmp_path):
    # By default any body.model is accepted (OpenAI batch files name OpenAI's models) and the
    # results name the daemon's model.
    job = client.create_job(requests=[line("a", model="gpt-4o-mini")])
    done, _ = client.wait(job.id)
    [result] = list(client.results(job.id))
    assert result["response"]["body"]["model"] == "tiny-mixtral"
    strict = Daemon(tmp_path / "strict", ["--check_model"]).start()
    try:
        strict_client = Client(strict.addr, timeout=60)
        code, message = error_of(
            lambda: strict_client.create_job(requests=[line("a", model="m" * 300_000)]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "body.model" in message and len(message) < 8192
        strict_client.create_job(requests=[line("a", model="tiny-mixtral")])
    finally:
        strict.stop()


def test_long_values_are_quoted_as_bounded_prefixes(client):
    long_id = "d" * 300_000
    code, message = error_of(lambda: client.create_job(requests=[line(long_id), line(long_id)]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "duplicate" in message and len(message) < 8192

    code, message = error_of(lambda: client.get_job("job_" + "f" * 100_000))
    assert code == grpc.StatusCode.NOT_FOUND
    assert "not found" in message and len(message) < 1024


@pytest.mark.parametrize("metadata,words", [
    ({f"k{i}": "v" for i in range(17)}, ["at most 16 pairs"]),
    ({"": "v"}, ["empty"]),
    ({"a\0b": "v"}, ["NUL"]),
    ({"k" * 65: "v"}, ["65 characters", "at most 64"]),
    ({"k": "é" * 513}, ["513 characters", "at most 512"]),
])
def test_metadata_beyond_openais_limits_is_refused(client, metadata, words):
    code, message = error_of(lambda: client.create_job(requests=[line("a")], metadata=metadata))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("metadata")
    for w in words:
        assert w in message, message


def test_metadata_at_the_limits_is_kept(client):
    metadata = {f"{i:02d}" + "k" * 62: "é" * 512 for i in range(16)}
    job = client.create_job(requests=[line("a")], metadata=metadata)
    assert dict(client.get_job(job.id).metadata) == metadata
    assert dict(client.list_jobs_page().jobs[0].metadata) == metadata
