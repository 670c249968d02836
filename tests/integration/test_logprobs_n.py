"""logprobs / top_logprobs and n > 1 through moebatchd and the Python client (docs/api.md,
"Log-probabilities" and "n choices"): requests built with the client's helpers, results parsed
from the output lines."""
import json
import math

import grpc
import pytest

from conftest import MODEL
from moebatch import ClientError, chat_request, completion_request

GOLDEN = [json.loads(line) for line in open(MODEL / "golden.jsonl")]
LOGPROBS = [json.loads(line) for line in open(MODEL / "logprobs.jsonl")]


def results_by_id(client, requests):
    job = client.create_job(requests=requests)
    done, _ = client.wait(job.id)
    assert done.request_counts.completed == len(requests)
    return {r["custom_id"]: r["response"]["body"] for r in client.results(job.id)}


def log_softmax(logits):
    top = max(logits)
    log_sum = math.log(sum(math.exp(z - top) for z in logits))
    return [z - top - log_sum for z in logits]


def test_completion_logprobs_match_transformers(client):
    ref = LOGPROBS[1]  # tests/fixtures/make_logprobs_golden.py: transformers' log_softmax
    steps = len(ref["token_ids"])
    body = results_by_id(client, [completion_request(
        "lp", ref["prompt_token_ids"], max_tokens=steps, temperature=0, ignore_eos=True,
        logprobs=5)])["lp"]
    choice = body["choices"][0]
    assert choice["token_ids"] == ref["token_ids"]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == steps
    for s in range(steps):
        assert abs(lp["token_logprobs"][s] - ref["logprobs"][s]) <= 1e-4
        top = lp["top_logprobs"][s]
        assert 1 <= len(top) <= 6 and lp["tokens"][s] in top  # top 5 (+ the sampled token)
        assert max(top.values()) == pytest.approx(ref["top_logprobs"][s][0], abs=1e-4)
    offsets = lp["text_offset"]
    assert offsets[0] == 0
    for s in range(1, steps):
        assert offsets[s] == offsets[s - 1] + len(lp["tokens"][s - 1])
    # The first token's value is the log_softmax of golden.jsonl's last prompt logits.
    g = next(g for g in GOLDEN if g["prompt_token_ids"] == ref["prompt_token_ids"])
    assert abs(lp["token_logprobs"][0] - log_softmax(g["last_logits"])[ref["token_ids"][0]]) <= 1e-4


def test_chat_logprobs_and_n_choices(client):
    seeded = chat_request("seeded", "Tell me about rivers", n=3, temperature=0.9, seed=5,
                          max_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=2)
    greedy = chat_request("greedy", "Tell me about rivers", n=2, temperature=0, max_tokens=8,
                          ignore_eos=True)
    single = chat_request("single", "Tell me about rivers", temperature=0.9, seed=5,
                          max_tokens=8, ignore_eos=True)
    first = results_by_id(client, [seeded, greedy, single])
    body = first["seeded"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 3 * 8
    for choice in body["choices"]:
        content = choice["logprobs"]["content"]
        assert choice["logprobs"]["refusal"] is None
        assert len(content) == len(choice["token_ids"]) == 8
        for entry in content:
            assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
            assert entry["logprob"] <= 0
            assert all(0 <= b <= 255 for b in entry["bytes"])
            assert len(entry["top_logprobs"]) == 2
            assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]
            assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"] - 1e-6
    # Choices of a seeded request differ; choice 0 is what the same request with n = 1 draws.
    ids = [c["token_ids"] for c in body["choices"]]
    assert len({tuple(x) for x in ids}) == 3
    assert ids[0] == first["single"]["choices"][0]["token_ids"]
    # Greedy choices are identical; no logprobs asked: null.
    greedy_choices = first["greedy"]["choices"]
    assert len(greedy_choices) == 2
    assert greedy_choices[0]["token_ids"] == greedy_choices[1]["token_ids"]
    assert greedy_choices[0]["logprobs"] is None
    # The same seeded request in another job: the same choices, the same logprobs.
    again = results_by_id(client, [seeded])["seeded"]
    assert [c["token_ids"] for c in again["choices"]] == ids
    assert again["choices"][2]["logprobs"] == body["choices"][2]["logprobs"]


@pytest.mark.parametrize("body, field", [
    ({"top_logprobs": 2}, "body.top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "body.top_logprobs"),
    ({"n": 17}, "body.n"),
    ({"n": 0}, "body.n"),
])
def test_bad_logprobs_and_n_are_refused(client, body, field):
    with pytest.raises(ClientError) as e:
        client.create_job(requests=[chat_request("bad", "hi", **body)])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in str(e.value)


def test_completion_logprobs_range(client):
    with pytest.raises(ClientError) as e:
        client.create_job(requests=[completion_request("bad", "hi", logprobs=6)])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "body.logprobs" in str(e.value)
