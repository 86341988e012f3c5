"""The Messages API's wire format (``POST /v1/messages``): answers, their event stream, errors."""

from __future__ import annotations

import json
import math
from typing import Any

from turnkeep.testing.fake_api.limits import Refusal
from turnkeep.testing.fake_api.steps import Answer, Failure
from turnkeep.testing.fake_api.wire import Event, text_pieces

ROUTE = "/v1/messages"
ENDING = "/messages"
REQUEST_ID_HEADER = "request-id"

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def answer_body(answer: Answer, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if answer.thinking:
        content.append({"type": "thinking", "thinking": answer.thinking, "signature": "sig"})
    if answer.text:
        content.append({"type": "text", "text": answer.text})
    content += [
        {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
        for call_id, name, arguments in answer.calls
    ]
    natural = "tool_use" if answer.calls else "end_turn"
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": answer.stop or natural,
        "stop_sequence": None,
        "usage": {
            "input_tokens": answer.usage.input,
            "output_tokens": answer.usage.output,
            "cache_read_input_tokens": answer.usage.cache_read,
            "cache_creation_input_tokens": answer.usage.cache_write,
        },
    }


def events(answer: Answer, model: str, request: dict[str, Any]) -> list[Event]:
    """The stream of ``answer_body``: the same message, in events."""
    whole = answer_body(answer, model)
    start = {**whole, "content": [], "stop_reason": None}
    start["usage"] = {**whole["usage"], "output_tokens": 1}
    events: list[Event] = [("message_start", {"type": "message_start", "message": start}, False)]
    for index, block in enumerate(whole["content"]):

        def delta(body: dict[str, Any], text: bool = False, i: int = index) -> Event:
            return (
                "content_block_delta",
                {"type": "content_block_delta", "index": i, "delta": body},
                text,
            )

        kind = block["type"]
        empty = {
            "text": {"type": "text", "text": ""},
            "thinking": {"type": "thinking", "thinking": "", "signature": ""},
        }
        first = empty.get(kind, {**block, "input": {}})
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": first},
                False,
            )
        )
        if kind == "text":
            events += [
                delta({"type": "text_delta", "text": p}, True) for p in text_pieces(block["text"])
            ]
        elif kind == "thinking":
            events.append(delta({"type": "thinking_delta", "thinking": block["thinking"]}))
            events.append(delta({"type": "signature_delta", "signature": block["signature"]}))
        else:
            events.append(
                delta({"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}, False))
    stop = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": whole["usage"]["output_tokens"]}
    events.append(
        ("message_delta", {"type": "message_delta", "delta": stop, "usage": usage}, False)
    )
    events.append(("message_stop", {"type": "message_stop"}, False))
    return events


def error_body(failure: Failure) -> dict[str, Any]:
    kind = failure.code or ERROR_TYPES.get(failure.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": failure.message}}


def rate_limited(refusal: Refusal, model: str) -> Failure:
    """A 429 ``rate_limit_error`` as Anthropic words it, with ``retry-after`` (whole seconds)."""
    unit = "requests" if refusal.kind == "requests" else "tokens"
    message = (
        f"This request would exceed the rate limit for your organization of {refusal.limit} "
        f"{unit} per minute. For details, refer to: https://docs.anthropic.com/en/api/rate-limits."
    )
    headers = {"retry-after": str(math.ceil(refusal.retry_after))}
    return Failure(429, message, headers)


def is_stop(event: Event) -> bool:
    return event[0] == "message_delta"
