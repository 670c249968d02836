"""OpenAI batch input lines from Python values, sent to the daemon as a JSONL payload.

The daemon is the validator (docs/api.md, "Input line" and "Bad input"): this module only puts
requests into the batch line shape, and does not check fields or ranges. A job with bad requests
is refused by the daemon with INVALID_ARGUMENT listing every bad line (raised as ClientError).
Accepted forms:

* a whole batch input line: {"custom_id", "method": "POST", "url", "body": {...}}, passed on as it
  is (method and url are filled in when missing, the url from the body as below);
* a bare request body with its custom_id beside the body fields: {"custom_id", "messages": [...],
  "max_tokens": 16}: the endpoint follows from "messages" (/v1/chat/completions), "prompt"
  (/v1/completions) or "input" (/v1/responses, OpenAI's Responses API);
* or the helpers chat_request() / completion_request() / sampling_params();
* a moebatch.v1.BatchRequest message, turned into the line the daemon would make of it.

Only the shape is checked here, with ValueError: an item that is not a dict or a BatchRequest, a
body that gives both "messages" and "prompt", a value JSON cannot encode.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .v1 import batch_pb2 as pb

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
RESPONSES_URL = "/v1/responses"


def _float_value(value: float) -> Any:
    # json.dumps writes NaN and the infinities as bare NaN / Infinity, which is not JSON: the
    # daemon would refuse the whole line as "invalid JSON". As strings, its message names the
    # field ("body.temperature: must be a number, got \"NaN\""), as for inline requests.
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def request_line(message: pb.BatchRequest) -> dict[str, Any]:
    """The batch input line of a BatchRequest message (as the daemon turns inline requests into
    lines)."""
    body: dict[str, Any] = {}
    which = message.WhichOneof("input")
    url = COMPLETIONS_URL
    if which == "chat":
        url = CHAT_URL
        body["messages"] = [{"role": m.role, "content": m.content}
                            for m in message.chat.messages]
    elif which == "prompt":
        body["prompt"] = message.prompt
    elif which == "prompt_token_ids":
        body["prompt"] = list(message.prompt_token_ids.ids)
    s = message.sampling
    for field in ("temperature", "top_p"):
        if s.HasField(field):
            body[field] = _float_value(getattr(s, field))
    for field in ("top_k", "seed", "max_tokens"):
        if s.HasField(field):
            body[field] = getattr(s, field)
    if s.stop:
        body["stop"] = list(s.stop)
    if s.ignore_eos:
        body["ignore_eos"] = True
    if s.HasField("n"):
        body["n"] = s.n
    if which == "chat":
        if s.HasField("response_format"):
            body["response_format"] = {"type": s.response_format}
        for field in ("logprobs", "top_logprobs"):
            if s.HasField(field):
                body[field] = getattr(s, field)
    elif s.HasField("logprobs") and s.logprobs:
        # /v1/completions' logprobs is an integer: the number of most likely tokens.
        body["logprobs"] = s.top_logprobs if s.HasField("top_logprobs") else 0
    elif s.HasField("top_logprobs"):
        body["top_logprobs"] = s.top_logprobs  # the daemon refuses it, naming the field
    return {"custom_id": message.custom_id, "method": "POST", "url": url, "body": body}


def _endpoint(body: Any) -> str:
    """The url of a line that gives none: from the body's "messages", "prompt" or "input"."""
    if not isinstance(body, Mapping):
        return CHAT_URL  # the daemon names the body
    given = [key for key in ("messages", "prompt", "input") if body.get(key) is not None]
    if len(given) > 1:
        raise ValueError("body: give one of messages (chat), prompt (completions) or input "
                         f"(responses), not {' and '.join(given)}")
    if given == ["prompt"]:
        return COMPLETIONS_URL
    return RESPONSES_URL if given == ["input"] else CHAT_URL


def build_request(obj: Mapping[str, Any] | pb.BatchRequest, custom_id: str | None = None
                  ) -> dict[str, Any]:
    """The batch input line (a dict) of a line dict, of a body dict carrying custom_id, or of a
    BatchRequest message; `custom_id` replaces the one given. Values are not checked."""
    if isinstance(obj, pb.BatchRequest):
        line = request_line(obj)
    elif isinstance(obj, Mapping):
        if "body" in obj:  # a whole batch input line
            line = dict(obj)
        else:  # a body with its custom_id among the fields
            line = {"custom_id": obj["custom_id"]} if "custom_id" in obj else {}
            line["body"] = {k: v for k, v in obj.items() if k != "custom_id"}
        if line.get("method") is None:
            line["method"] = "POST"
        if line.get("url") is None:
            line["url"] = _endpoint(line["body"])
    else:
        raise ValueError(f"request: must be a dict or a BatchRequest, got {type(obj).__name__}")
    if custom_id is not None:
        line["custom_id"] = custom_id
    return line


def build_requests(items: Iterable[Mapping[str, Any] | pb.BatchRequest]) -> list[dict[str, Any]]:
    """build_request() over a sequence; shape errors are prefixed with the 0-based item index
    ("requests[3]: ...")."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        try:
            out.append(build_request(item))
        except ValueError as e:
            raise ValueError(f"requests[{i}]: {e}") from None
    return out


def _dumps(line: Mapping[str, Any]) -> bytes:
    try:
        text = json.dumps(line, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"cannot be written as JSON: {e}") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate: as a \\u escape, so that the daemon names the line and the field.
        return json.dumps(line, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def to_jsonl(items: Iterable[Mapping[str, Any] | pb.BatchRequest]) -> bytes:
    """The JSONL payload (CreateJobRequest.jsonl) of requests in any form build_request takes:
    one line per request, in order, each ending in "\\n". Line N of the payload is requests[N-1],
    so the daemon's "line N" names the item."""
    lines = []
    for i, line in enumerate(build_requests(items)):
        try:
            lines.append(_dumps(line))
        except ValueError as e:
            raise ValueError(f"requests[{i}]: {e}") from None
    return b"".join(line + b"\n" for line in lines)


def sampling_params(**fields: Any) -> dict[str, Any]:
    """Body fields from keyword fields with OpenAI names, None dropped: sampling_params(
    temperature=0, max_tokens=32, stop=["\\n"]). Merge it into a body, or pass it as **kwargs to
    chat_request / completion_request."""
    return {key: value for key, value in fields.items() if value is not None}


def chat_request(custom_id: str, messages: str | Sequence[Mapping[str, Any]], **sampling: Any
                 ) -> dict[str, Any]:
    """A /v1/chat/completions batch input line. `messages` is a list of {"role", "content"}
    dicts, or a string for a single user message; `sampling` are body fields (max_tokens,
    temperature, ...)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    else:
        messages = list(messages)
    return {"custom_id": custom_id, "method": "POST", "url": CHAT_URL,
            "body": {"messages": messages, **sampling_params(**sampling)}}


def completion_request(custom_id: str, prompt: str | Sequence[int], **sampling: Any
                       ) -> dict[str, Any]:
    """A /v1/completions batch input line: a text prompt (the daemon adds BOS) or a list of
    token ids (used as given)."""
    if not isinstance(prompt, str):
        prompt = list(prompt)
    return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS_URL,
            "body": {"prompt": prompt, **sampling_params(**sampling)}}
