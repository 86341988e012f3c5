"""Chat Completions' wire format (``POST /v1/chat/completions``): answers, their chunk stream,
errors."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from turnkeep.testing.fake_api.limits import Refusal
from turnkeep.testing.fake_api.steps import Answer, Failure
from turnkeep.testing.fake_api.wire import Event, text_pieces

ROUTE = "/v1/chat/completions"
ENDING = "/chat/completions"
REQUEST_ID_HEADER = "x-request-id"


def answer_body(answer: Answer, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.thinking:
        message["reasoning_content"] = answer.thinking
    if answer.calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
            for call_id, name, arguments in answer.calls
        ]
    natural = "tool_calls" if answer.calls else "stop"
    prompt = answer.usage.input + answer.usage.cache_read  # OpenAI counts cached tokens in
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": answer.stop or natural}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": answer.usage.output,
            "total_tokens": prompt + answer.usage.output,
            "prompt_tokens_details": {"cached_tokens": answer.usage.cache_read},
        },
    }


def events(answer: Answer, model: str, request: dict[str, Any]) -> list[Event]:
    """The stream of ``answer_body``: ``chat.completion.chunk``s, then the usage chunk when the
    request asked for it (``stream_options.include_usage``), then ``[DONE]``."""
    whole = answer_body(answer, model)
    message, finish = whole["choices"][0]["message"], whole["choices"][0]["finish_reason"]

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, text: bool = False) -> Event:
        body = {
            "id": whole["id"],
            "object": "chat.completion.chunk",
            "created": whole["created"],
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        return (None, body, text)

    events = [chunk({"role": "assistant", "content": ""})]
    if "reasoning_content" in message:
        events.append(chunk({"reasoning_content": message["reasoning_content"]}))
    if message["content"]:
        events += [chunk({"content": p}, text=True) for p in text_pieces(message["content"])]
    for index, call in enumerate(message.get("tool_calls", [])):
        start = {
            **call,
            "index": index,
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        events.append(chunk({"tool_calls": [start]}))
        arguments = {"index": index, "function": {"arguments": call["function"]["arguments"]}}
        events.append(chunk({"tool_calls": [arguments]}))
    events.append(chunk({}, finish))
    if request.get("stream_options"):
        body = {key: whole[key] for key in ("id", "created", "model")}
        body.update({"object": "chat.completion.chunk", "choices": [], "usage": whole["usage"]})
        events.append((None, body, False))
    events.append((None, "[DONE]", False))
    return events


def error_body(failure: Failure) -> dict[str, Any]:
    return {
        "error": {
            "message": failure.message,
            "type": failure.kind
            or ("invalid_request_error" if failure.status < 500 else "server_error"),
            "param": None,
            "code": failure.code,
        }
    }


def rate_limited(refusal: Refusal, model: str) -> Failure:
    """A 429 as OpenAI words it, with ``retry-after`` (whole seconds) and ``retry-after-ms``."""
    unit = "requests per min (RPM)" if refusal.kind == "requests" else "tokens per min (TPM)"
    wait = (
        f"{refusal.retry_after * 1000:.0f}ms"
        if refusal.retry_after < 1
        else (f"{refusal.retry_after:.3f}s")
    )
    message = (
        f"Rate limit reached for {model} in organization org-fake on {unit}: "
        f"Limit {refusal.limit}, Used {refusal.used}, Requested {refusal.requested}. "
        f"Please try again in {wait}."
    )
    headers = {
        "retry-after": str(math.ceil(refusal.retry_after)),
        "retry-after-ms": str(math.ceil(refusal.retry_after * 1000)),
    }
    return Failure(429, message, headers, code="rate_limit_exceeded", kind=refusal.kind)


def is_stop(event: Event) -> bool:
    """The chunk with the ``finish_reason`` (the usage chunk and ``[DONE]`` come after it)."""
    _, body, _ = event
    choices = body.get("choices") if isinstance(body, dict) else None
    return (
        isinstance(choices, list) and bool(choices) and choices[0].get("finish_reason") is not None
    )
