"""Building OpenAI batch input lines and the JSONL payload (no daemon needed). The client only
shapes requests: field values, however wrong, go to the daemon as given (it is the validator;
test_fake_server.py checks that its refusal surfaces as ClientError)."""
import json

import pytest

from moebatch import (
    build_request,
    build_requests,
    chat_request,
    completion_request,
    request_line,
    sampling_params,
    to_jsonl,
)
from moebatch.v1 import batch_pb2 as pb

CHAT = [{"role": "user", "content": "x"}]


def line(body, custom_id="q-1", url="/v1/chat/completions", **extra):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}


def test_a_whole_line_passes_through():
    obj = line({"model": "mixtral", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        "max_tokens": 64, "stream": False})
    assert build_request(obj) == obj
    assert build_request(obj) is not obj  # a copy
    assert build_request(obj, custom_id="q-2")["custom_id"] == "q-2"
    assert obj["custom_id"] == "q-1"


def test_a_line_without_method_or_url_gets_them():
    assert build_request({"custom_id": "a", "body": {"prompt": "Once"}}) == {
        "custom_id": "a", "body": {"prompt": "Once"}, "method": "POST", "url": "/v1/completions"}
    assert build_request({"custom_id": "a", "body": {"messages": CHAT}})["url"] == (
        "/v1/chat/completions")


def test_body_form_infers_the_endpoint():
    r = build_request({"custom_id": "a", "messages": CHAT, "temperature": 0.7})
    assert r == line({"messages": CHAT, "temperature": 0.7}, custom_id="a")
    r = build_request({"prompt": [5, 6]}, custom_id="b")
    assert r == line({"prompt": [5, 6]}, custom_id="b", url="/v1/completions")
    r = build_request({"input": "Hi", "max_output_tokens": 4}, custom_id="c")
    assert r == line({"input": "Hi", "max_output_tokens": 4}, custom_id="c", url="/v1/responses")
    # Without custom_id the line has none: the daemon names the missing field.
    assert "custom_id" not in build_request({"messages": CHAT})


def test_helpers_build_lines():
    assert chat_request("c1", "Hello", max_tokens=4, temperature=0) == {
        "custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
                 "temperature": 0}}
    assert completion_request("c2", (1, 2, 3), seed=7, stop=None) == {
        "custom_id": "c2", "method": "POST", "url": "/v1/completions",
        "body": {"prompt": [1, 2, 3], "seed": 7}}
    assert sampling_params(temperature=1.5, top_k=3, seed=None) == {"temperature": 1.5, "top_k": 3}
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert chat_request("c3", messages)["body"]["messages"] == messages


def test_a_message_becomes_the_daemons_line():
    msg = pb.BatchRequest(custom_id="x", prompt="p")
    msg.sampling.temperature = 0
    msg.sampling.max_tokens = 8
    msg.sampling.stop.append("\n")
    assert request_line(msg) == line({"prompt": "p", "temperature": 0.0, "max_tokens": 8,
                                      "stop": ["\n"]}, custom_id="x", url="/v1/completions")
    chat = pb.BatchRequest(custom_id="c", chat=pb.ChatMessages(messages=[
        pb.ChatMessage(role="user", content="hi")]))
    chat.sampling.ignore_eos = True
    assert build_request(chat) == line({"messages": [{"role": "user", "content": "hi"}],
                                        "ignore_eos": True}, custom_id="c")
    ids = pb.BatchRequest(custom_id="i", prompt_token_ids=pb.TokenIds(ids=[1, 2]))
    assert build_request(ids, custom_id="j")["body"] == {"prompt": [1, 2]}
    nan = pb.BatchRequest(custom_id="n", prompt="p")
    nan.sampling.top_p = float("nan")
    assert request_line(nan)["body"]["top_p"] == "NaN"  # the daemon names the field


def test_n_and_logprobs_follow_the_endpoint():
    chat = pb.BatchRequest(custom_id="c", chat=pb.ChatMessages(messages=[
        pb.ChatMessage(role="user", content="hi")]))
    chat.sampling.n = 3
    chat.sampling.logprobs = True
    chat.sampling.top_logprobs = 2
    assert request_line(chat)["body"] == {"messages": [{"role": "user", "content": "hi"}],
                                          "n": 3, "logprobs": True, "top_logprobs": 2}
    # /v1/completions: logprobs is the number of most likely tokens.
    comp = pb.BatchRequest(custom_id="p", prompt="p")
    comp.sampling.logprobs = True
    comp.sampling.top_logprobs = 4
    assert request_line(comp)["body"] == {"prompt": "p", "logprobs": 4}
    comp.sampling.ClearField("top_logprobs")
    assert request_line(comp)["body"] == {"prompt": "p", "logprobs": 0}
    comp.sampling.logprobs = False
    assert request_line(comp)["body"] == {"prompt": "p"}
    # response_format: chat's body field (JSON mode); /v1/completions has none.
    chat.sampling.response_format = "json_object"
    assert request_line(chat)["body"]["response_format"] == {"type": "json_object"}
    comp.sampling.response_format = "json_object"
    assert "response_format" not in request_line(comp)["body"]


@pytest.mark.parametrize("obj", [
    line({"messages": CHAT}, custom_id=""),
    line({"messages": CHAT}, custom_id=7),
    line({"messages": CHAT}, method="GET"),
    line({"messages": CHAT}, url="/v1/embeddings"),
    line("not a dict"),
    line({"messages": []}),
    line({"messages": [{"role": "tool", "content": "x"}]}),
    line({"prompt": [1, -2]}, url="/v1/completions"),
    line({"messages": CHAT, "model": 3}),
    line({"messages": CHAT, "temperature": "0.5"}),
    line({"messages": CHAT, "temperature": 101}),
    line({"messages": CHAT, "top_p": 0}),
    line({"messages": CHAT, "top_k": -1}),
    line({"messages": CHAT, "seed": 2**64}),
    line({"messages": CHAT, "max_tokens": 0}),
    line({"messages": CHAT, "max_tokens": 16.0}),
    line({"messages": CHAT, "max_tokens": 4, "max_completion_tokens": 5}),
    line({"messages": CHAT, "stop": ["a", "b", "c", "d", "e"]}),
    line({"messages": CHAT, "n": 2}),
    line({"messages": CHAT, "ignore_eos": 1}),
])
def test_field_values_are_not_checked_here(obj):
    built = build_request(obj)
    assert built == obj
    payload = to_jsonl([obj])
    assert payload.endswith(b"\n") and payload.count(b"\n") == 1
    assert json.loads(payload) == obj  # sent as given: the daemon judges it


def test_shape_errors_raise_value_error_naming_the_item():
    with pytest.raises(ValueError, match="^request: must be a dict"):
        build_request(["custom_id", "x"])
    with pytest.raises(ValueError, match=r"^requests\[1\]: body: give one of messages .*, not "
                                         r"messages and prompt$"):
        build_requests([{"custom_id": "a", "messages": CHAT},
                        {"custom_id": "b", "messages": CHAT, "prompt": "x"}])
    with pytest.raises(ValueError, match=r"not prompt and input$"):
        build_request({"custom_id": "b", "prompt": "x", "input": "y"})
    with pytest.raises(ValueError, match=r"^requests\[0\]: cannot be written as JSON"):
        to_jsonl([{"custom_id": "a", "messages": CHAT, "temperature": {1, 2}}])


def test_to_jsonl_one_line_per_item_in_order():
    items = [chat_request("a", "Hi \u00e9"), {"custom_id": "b", "prompt": "x"},
             pb.BatchRequest(custom_id="c", prompt="y"),
             {"custom_id": "a", "messages": CHAT}]  # a duplicate: the daemon's to refuse
    payload = to_jsonl(items)
    lines = payload.decode("utf-8").split("\n")
    assert lines[-1] == ""
    assert [json.loads(x)["custom_id"] for x in lines[:-1]] == ["a", "b", "c", "a"]
    assert "\u00e9" in lines[0]  # UTF-8, not \\u escapes
    # A lone surrogate cannot be UTF-8: it goes as a \ud800 escape, for the daemon to refuse.
    assert b"\\ud800" in to_jsonl([chat_request("s", "\ud800")])
    assert to_jsonl([]) == b""
