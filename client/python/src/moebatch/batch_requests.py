"""Builds moebatch.v1.BatchRequest messages from OpenAI-style dicts.

The rules follow the daemon's OpenAI batch line parser (docs/api.md, "Input line"), so a dict that
builds here is one the daemon's JSONL path would accept, and errors name the field the same way
("body.temperature: must be a number, got '0.5'"). Accepted forms:

* a whole batch input line: {"custom_id", "method": "POST", "url", "body": {...}};
* a bare request body with its custom_id beside the body fields: {"custom_id", "messages": [...],
  "max_tokens": 16} (the endpoint follows from "messages" or "prompt");
* or the helpers chat_request() / completion_request() / sampling_params().

As in the daemon: an explicit None counts as not given; body keys that OpenAI has but moebatch does
not use (stream, logprobs, penalties, tools, ...) are ignored; body.model is checked to be a string
and otherwise dropped (the job's model is CreateJob's `model`). Range checks mirror the sampler's:
temperature in [0, 100], top_p in (0, 1], top_k >= 0, max_tokens >= 1, seed in [0, 2^64), up to 4
non-empty stop strings, n == 1. Whatever depends on the model (prompt length against the context,
token ids against the vocabulary, chat role order) is left to the daemon.

Every problem raises ValueError whose message starts with the offending field's path.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .v1 import batch_pb2 as pb

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 4
_INT32_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _invalid(path: str, what: str, value: Any = ...) -> ValueError:
    if value is ...:
        return ValueError(f"{path}: {what}")
    return ValueError(f"{path}: {what}, got {_describe(value)}")


def _is_int(value: Any) -> bool:
    # bool is an int subclass in Python but not a JSON integer.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and not (
        isinstance(value, float) and math.isnan(value)
    )


def _int32(path: str, value: Any) -> int:
    if not _is_int(value) or not -(2**31) <= value <= _INT32_MAX:
        raise _invalid(path, "must be a 32-bit integer", value)
    return value


def _number(path: str, value: Any) -> float:
    if not _is_number(value):
        raise _invalid(path, "must be a number", value)
    return float(value)


def _content(path: str, content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
        raise _invalid(path, "must be a string or an array of text parts", content)
    texts = []
    for i, part in enumerate(content):
        part_path = f"{path}[{i}]"
        if not isinstance(part, Mapping):
            raise _invalid(part_path, "must be an object", part)
        if part.get("type") != "text":
            raise _invalid(f"{part_path}.type", 'only "text" parts are supported', part.get("type"))
        if not isinstance(part.get("text"), str):
            raise _invalid(f"{part_path}.text", "must be a string", part.get("text"))
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(path: str, messages: Any) -> pb.ChatMessages:
    if isinstance(messages, str) or not isinstance(messages, Sequence) or not messages:
        raise _invalid(path, "must be a non-empty array", messages)
    out = pb.ChatMessages()
    for i, message in enumerate(messages):
        item = f"{path}[{i}]"
        if not isinstance(message, Mapping):
            raise _invalid(item, "must be an object", message)
        role = message.get("role")
        if role not in ROLES:
            raise _invalid(f"{item}.role", "must be one of system, user, assistant", role)
        if message.get("content") is None:
            raise _invalid(f"{item}.content", "required")
        out.messages.add(role=role, content=_content(f"{item}.content", message["content"]))
    return out


def _token_ids(path: str, ids: Sequence[Any]) -> pb.TokenIds:
    for i, token in enumerate(ids):
        if not _is_int(token) or not 0 <= token <= _INT32_MAX:
            raise _invalid(f"{path}[{i}]", "must be a non-negative integer token id", token)
    return pb.TokenIds(ids=list(ids))


def _set_prompt(request: pb.BatchRequest, prompt: Any) -> None:
    """prompt: "text", [id, ...], ["text"] or [[id, ...]]: exactly one prompt per request."""
    if prompt is None:
        raise _invalid("body.prompt", "required")
    if isinstance(prompt, str):
        request.prompt = prompt
        return
    if not isinstance(prompt, Sequence) or isinstance(prompt, (bytes, bytearray)):
        raise _invalid(
            "body.prompt",
            "must be a string, an array of token ids, or a 1-element array of either",
            prompt,
        )
    if len(prompt) == 0:
        raise _invalid("body.prompt", "must not be an empty array")
    first = prompt[0]
    if isinstance(first, str) or (isinstance(first, Sequence) and not isinstance(first, bytes)):
        if len(prompt) != 1:
            raise _invalid(
                "body.prompt", f"only one prompt per request is supported, got {len(prompt)}"
            )
        if isinstance(first, str):
            request.prompt = first
            return
        if len(first) == 0:
            raise _invalid("body.prompt[0]", "must not be an empty array")
        request.prompt_token_ids.CopyFrom(_token_ids("body.prompt[0]", first))
        return
    request.prompt_token_ids.CopyFrom(_token_ids("body.prompt", prompt))


def _given(body: Mapping[str, Any], key: str) -> Any:
    return body.get(key)  # None when absent or null: both mean "not given"


def sampling_from_body(body: Mapping[str, Any]) -> pb.SamplingParams:
    """The SamplingParams of an OpenAI request body (max_tokens, temperature, top_p, top_k, seed,
    stop, n, ignore_eos; max_completion_tokens as an alias of max_tokens)."""
    s = pb.SamplingParams()
    max_tokens = _given(body, "max_tokens")
    max_completion = _given(body, "max_completion_tokens")
    if max_tokens is not None:
        _int32("body.max_tokens", max_tokens)
    if max_completion is not None:
        _int32("body.max_completion_tokens", max_completion)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise _invalid(
            "body.max_completion_tokens",
            f"must equal body.max_tokens when both are given, got {max_completion} and {max_tokens}",
        )
    if max_tokens is not None or max_completion is not None:
        field = "body.max_tokens" if max_tokens is not None else "body.max_completion_tokens"
        value = max_tokens if max_tokens is not None else max_completion
        if value < 1:
            raise _invalid(field, "must be >= 1", value)
        s.max_tokens = value

    if (v := _given(body, "temperature")) is not None:
        t = _number("body.temperature", v)
        if not 0.0 <= t <= 100.0:
            raise _invalid("body.temperature", "must be in [0, 100]", v)
        s.temperature = t
    if (v := _given(body, "top_p")) is not None:
        p = _number("body.top_p", v)
        if not 0.0 < p <= 1.0:
            raise _invalid("body.top_p", "must be in (0, 1]", v)
        s.top_p = p
    if (v := _given(body, "top_k")) is not None:
        if _int32("body.top_k", v) < 0:
            raise _invalid("body.top_k", "must be >= 0", v)
        s.top_k = v
    if (v := _given(body, "seed")) is not None:
        if not _is_int(v) or not 0 <= v <= _UINT64_MAX:
            raise _invalid("body.seed", "must be a non-negative integer", v)
        s.seed = v
    if (v := _given(body, "stop")) is not None:
        if isinstance(v, str):
            if not v:
                raise _invalid("body.stop", "must not be an empty string")
            s.stop.append(v)
        elif isinstance(v, Sequence) and not isinstance(v, (bytes, bytearray)):
            if len(v) > MAX_STOP_STRINGS:
                raise _invalid(
                    "body.stop",
                    f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(v)}",
                )
            for i, item in enumerate(v):
                if not isinstance(item, str) or not item:
                    raise _invalid(f"body.stop[{i}]", "must be a non-empty string", item)
                s.stop.append(item)
        else:
            raise _invalid("body.stop", "must be a string or an array of up to 4 strings", v)
    if (v := _given(body, "n")) is not None:
        if not _is_int(v) or v != 1:
            raise _invalid("body.n", "only 1 is supported", v)
    if (v := _given(body, "ignore_eos")) is not None:
        if not isinstance(v, bool):
            raise _invalid("body.ignore_eos", "must be a boolean", v)
        s.ignore_eos = v
    return s


def _custom_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _invalid("custom_id", "must be a non-empty string", value)
    return value


def build_request(obj: Mapping[str, Any] | pb.BatchRequest, custom_id: str | None = None
                  ) -> pb.BatchRequest:
    """One BatchRequest from a batch input line dict, or from a body dict carrying custom_id (or
    given `custom_id`). A BatchRequest message is returned as is (custom_id set if given)."""
    if isinstance(obj, pb.BatchRequest):
        if custom_id is not None:
            copy = pb.BatchRequest()
            copy.CopyFrom(obj)
            copy.custom_id = _custom_id(custom_id)
            return copy
        return obj
    if not isinstance(obj, Mapping):
        raise ValueError(f"request: must be a dict or a BatchRequest, got {type(obj).__name__}")

    if "body" in obj:  # a whole batch input line
        body = obj["body"]
        if not isinstance(body, Mapping):
            raise _invalid("body", "must be an object", body)
        cid = custom_id if custom_id is not None else obj.get("custom_id")
        method = obj.get("method")
        if method is not None and method != "POST":
            raise _invalid("method", "must be POST", method)
        url = obj.get("url")
        if url is not None and url not in (CHAT_URL, COMPLETIONS_URL):
            raise _invalid("url", f"must be {CHAT_URL} or {COMPLETIONS_URL}", url)
    else:  # a body with its custom_id among the fields
        body = obj
        cid = custom_id if custom_id is not None else obj.get("custom_id")
        url = None

    request = pb.BatchRequest(custom_id=_custom_id(cid))
    if url is None:
        has_messages = body.get("messages") is not None
        has_prompt = body.get("prompt") is not None
        if has_messages and has_prompt:
            raise ValueError("body: give either messages (chat) or prompt (completions), not both")
        if not has_messages and not has_prompt:
            raise ValueError("body.messages: required (or body.prompt for /v1/completions)")
        url = CHAT_URL if has_messages else COMPLETIONS_URL

    if (model := body.get("model")) is not None and not isinstance(model, str):
        raise _invalid("body.model", "must be a string", model)
    if url == CHAT_URL:
        request.chat.CopyFrom(_messages("body.messages", body.get("messages")))
    else:
        _set_prompt(request, body.get("prompt"))
    request.sampling.CopyFrom(sampling_from_body(body))
    return request


def build_requests(items: Iterable[Mapping[str, Any] | pb.BatchRequest]) -> list[pb.BatchRequest]:
    """build_request() over a sequence; errors are prefixed with the 0-based item index
    ("requests[3]: body.top_p: ...") and duplicate custom_ids are refused."""
    out: list[pb.BatchRequest] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        try:
            request = build_request(item)
        except ValueError as e:
            raise ValueError(f"requests[{i}]: {e}") from None
        if request.custom_id in seen:
            raise ValueError(f"requests[{i}]: custom_id: {request.custom_id!r} is used twice")
        seen.add(request.custom_id)
        out.append(request)
    return out


def sampling_params(**fields: Any) -> pb.SamplingParams:
    """SamplingParams from keyword fields with OpenAI names: sampling_params(temperature=0,
    max_tokens=32, stop=["\\n"])."""
    return sampling_from_body(fields)


def chat_request(custom_id: str, messages: str | Sequence[Mapping[str, Any]], **sampling: Any
                 ) -> pb.BatchRequest:
    """A /v1/chat/completions request. `messages` is a list of {"role", "content"} dicts, or a
    string for a single user message."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    return build_request({"custom_id": custom_id, "url": CHAT_URL,
                          "body": {"messages": messages, **sampling}})


def completion_request(custom_id: str, prompt: str | Sequence[int], **sampling: Any
                       ) -> pb.BatchRequest:
    """A /v1/completions request: a text prompt (the daemon adds BOS) or a list of token ids
    (used as given)."""
    return build_request({"custom_id": custom_id, "url": COMPLETIONS_URL,
                          "body": {"prompt": prompt, **sampling}})
