"""Building BatchRequest messages from OpenAI-style dicts (no daemon needed)."""
import pytest

from moebatch import (
    build_request,
    build_requests,
    chat_request,
    completion_request,
    sampling_params,
)
from moebatch.v1 import batch_pb2 as pb


def line(body, custom_id="q-1", url="/v1/chat/completions", **extra):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}


def test_chat_line():
    r = build_request(line({"model": "mixtral", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"}], "max_tokens": 64}))
    assert r.custom_id == "q-1"
    assert r.WhichOneof("input") == "chat"
    assert [(m.role, m.content) for m in r.chat.messages] == [
        ("system", "Be brief."), ("user", "Hello")]
    assert r.sampling.HasField("max_tokens") and r.sampling.max_tokens == 64
    assert not r.sampling.HasField("temperature")  # unset: the daemon's default


def test_chat_content_parts_are_joined():
    r = build_request(line({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}))
    assert r.chat.messages[0].content == "a\nb"


def test_completion_text_prompt():
    r = build_request(line({"prompt": "Once upon", "max_tokens": 8}, url="/v1/completions"))
    assert r.WhichOneof("input") == "prompt"
    assert r.prompt == "Once upon"
    r = build_request(line({"prompt": ["Once upon"]}, url="/v1/completions"))
    assert r.prompt == "Once upon"


@pytest.mark.parametrize("prompt", [[1, 415, 2936], [[1, 415, 2936]]])
def test_completion_token_id_prompt(prompt):
    r = build_request(line({"prompt": prompt}, url="/v1/completions"))
    assert r.WhichOneof("input") == "prompt_token_ids"
    assert list(r.prompt_token_ids.ids) == [1, 415, 2936]


def test_sampling_fields():
    r = build_request(line({
        "messages": [{"role": "user", "content": "x"}], "temperature": 0, "top_p": 0.5,
        "top_k": 40, "seed": 2**64 - 1, "max_tokens": 16, "stop": ["\n", "END"],
        "ignore_eos": True, "n": 1,
        # OpenAI fields moebatch ignores, as the daemon does
        "stream": False, "logprobs": None, "presence_penalty": 0.1,
    }))
    s = r.sampling
    assert s.HasField("temperature") and s.temperature == 0.0
    assert s.top_p == pytest.approx(0.5)
    assert s.top_k == 40
    assert s.seed == 2**64 - 1
    assert s.max_tokens == 16
    assert list(s.stop) == ["\n", "END"]
    assert s.ignore_eos is True


def test_stop_string_and_max_completion_tokens_alias():
    r = build_request(line({"messages": [{"role": "user", "content": "x"}], "stop": "###",
                            "max_completion_tokens": 12}))
    assert list(r.sampling.stop) == ["###"]
    assert r.sampling.max_tokens == 12


def test_null_means_not_given():
    r = build_request(line({"messages": [{"role": "user", "content": "x"}], "temperature": None,
                            "max_tokens": None, "seed": None}))
    assert not r.sampling.HasField("temperature")
    assert not r.sampling.HasField("max_tokens")
    assert not r.sampling.HasField("seed")


def test_body_form_infers_the_endpoint():
    r = build_request({"custom_id": "a", "messages": [{"role": "user", "content": "hi"}],
                       "temperature": 0.7})
    assert r.WhichOneof("input") == "chat"
    assert r.sampling.temperature == pytest.approx(0.7)
    r = build_request({"prompt": [5, 6]}, custom_id="b")
    assert r.custom_id == "b" and list(r.prompt_token_ids.ids) == [5, 6]


def test_helpers():
    r = chat_request("c1", "Hello", max_tokens=4, temperature=0)
    assert r.chat.messages[0].role == "user" and r.chat.messages[0].content == "Hello"
    assert r.sampling.max_tokens == 4
    r = completion_request("c2", [1, 2, 3], seed=7)
    assert list(r.prompt_token_ids.ids) == [1, 2, 3] and r.sampling.seed == 7
    s = sampling_params(temperature=1.5, top_k=3)
    assert s.temperature == pytest.approx(1.5) and s.top_k == 3


def test_message_passes_through():
    msg = pb.BatchRequest(custom_id="x", prompt="p")
    assert build_request(msg) is msg
    renamed = build_request(msg, custom_id="y")
    assert renamed.custom_id == "y" and msg.custom_id == "x" and renamed.prompt == "p"


CHAT = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("obj, field", [
    (line({"messages": CHAT}, custom_id=""), "custom_id"),
    (line({"messages": CHAT}, custom_id=7), "custom_id"),
    ({"messages": CHAT}, "custom_id"),
    (line({"messages": CHAT}, method="GET"), "method"),
    (line({"messages": CHAT}, url="/v1/embeddings"), "url"),
    (line("not a dict"), "body"),
    (line({"messages": []}), "body.messages"),
    (line({"messages": "hello"}), "body.messages"),
    (line({}), "body.messages"),
    (line({"messages": ["hello"]}), "body.messages[0]"),
    (line({"messages": [{"role": "tool", "content": "x"}]}), "body.messages[0].role"),
    (line({"messages": [{"role": "user"}]}), "body.messages[0].content"),
    (line({"messages": [{"role": "user", "content": 5}]}), "body.messages[0].content"),
    (line({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
     "body.messages[0].content[0].type"),
    (line({"prompt": 5}, url="/v1/completions"), "body.prompt"),
    (line({"prompt": []}, url="/v1/completions"), "body.prompt"),
    (line({"prompt": ["a", "b"]}, url="/v1/completions"), "body.prompt"),
    (line({"prompt": [[]]}, url="/v1/completions"), "body.prompt[0]"),
    (line({"prompt": [1, -2]}, url="/v1/completions"), "body.prompt[1]"),
    (line({"prompt": [1, 2.5]}, url="/v1/completions"), "body.prompt[1]"),
    (line({"prompt": [1, True]}, url="/v1/completions"), "body.prompt[1]"),
    (line({"messages": CHAT, "model": 3}), "body.model"),
    (line({"messages": CHAT, "temperature": "0.5"}), "body.temperature"),
    (line({"messages": CHAT, "temperature": -1}), "body.temperature"),
    (line({"messages": CHAT, "temperature": 101}), "body.temperature"),
    (line({"messages": CHAT, "top_p": 0}), "body.top_p"),
    (line({"messages": CHAT, "top_p": 1.5}), "body.top_p"),
    (line({"messages": CHAT, "top_k": -1}), "body.top_k"),
    (line({"messages": CHAT, "top_k": 2.0}), "body.top_k"),
    (line({"messages": CHAT, "seed": -1}), "body.seed"),
    (line({"messages": CHAT, "seed": 2**64}), "body.seed"),
    (line({"messages": CHAT, "max_tokens": 0}), "body.max_tokens"),
    (line({"messages": CHAT, "max_tokens": 16.0}), "body.max_tokens"),
    (line({"messages": CHAT, "max_tokens": "16"}), "body.max_tokens"),
    (line({"messages": CHAT, "max_tokens": 2**31}), "body.max_tokens"),
    (line({"messages": CHAT, "max_completion_tokens": 0}), "body.max_completion_tokens"),
    (line({"messages": CHAT, "max_tokens": 4, "max_completion_tokens": 5}),
     "body.max_completion_tokens"),
    (line({"messages": CHAT, "stop": ""}), "body.stop"),
    (line({"messages": CHAT, "stop": ["a", ""]}), "body.stop[1]"),
    (line({"messages": CHAT, "stop": ["a", "b", "c", "d", "e"]}), "body.stop"),
    (line({"messages": CHAT, "stop": 5}), "body.stop"),
    (line({"messages": CHAT, "n": 2}), "body.n"),
    (line({"messages": CHAT, "ignore_eos": 1}), "body.ignore_eos"),
    ({"custom_id": "a", "messages": CHAT, "prompt": "x"}, "body"),
])
def test_bad_dicts_raise_value_error_naming_the_field(obj, field):
    with pytest.raises(ValueError) as info:
        build_request(obj)
    assert str(info.value).startswith(field + ":"), str(info.value)


def test_not_a_dict():
    with pytest.raises(ValueError, match="request: must be a dict"):
        build_request(["custom_id", "x"])


def test_build_requests_names_the_item():
    good = {"custom_id": "a", "messages": CHAT}
    with pytest.raises(ValueError, match=r"^requests\[1\]: body.top_k: must be >= 0, got -3$"):
        build_requests([good, {"custom_id": "b", "messages": CHAT, "top_k": -3}])
    with pytest.raises(ValueError, match=r"^requests\[1\]: custom_id: 'a' is used twice$"):
        build_requests([good, dict(good)])
    assert [r.custom_id for r in build_requests([good, {**good, "custom_id": "b"}])] == ["a", "b"]
