"""A streamed call whose server does not stream as asked: what the streaming providers do with
an answer that is not an event stream, or a stream that ends before it says it is done.

Some OpenAI-compatible servers and proxies answer a streamed request (``stream: true``) with
the whole non-streamed body (``application/json``): that body is the answer, read as the call
made without streaming would read it. A stream that ends cleanly before its stop reason (no
``finish_reason``, no ``message_delta``) may be cut short: it is refused, with an error that
names the server and the config key that turns streaming off for it, rather than taken as a
complete answer. Non-retryable: a server that ends its streams this way does so on every
attempt, and the fix is in the worker's config.
"""

from __future__ import annotations

import json
from typing import Any, Protocol
from urllib.parse import urlsplit

from temporalio.exceptions import ApplicationError

from turnkeep.contract.messages import Message
from turnkeep.providers.errors import response_invalid
from turnkeep.providers.streaming import DeltaSink

STREAM_INCOMPLETE = "ProviderStreamIncomplete"


class Response(Protocol):
    """The HTTP response under an SDK's stream (httpx's, as both SDKs hand it over)."""

    @property
    def headers(self) -> Any: ...

    async def aread(self) -> bytes: ...


def is_json(response: Response) -> bool:
    """Whether a streamed request was answered with a JSON body instead of events."""
    media_type = str(response.headers.get("content-type") or "").split(";", 1)[0]
    return media_type.strip().lower().endswith("json")


async def json_body(response: Response, provider: str) -> dict[str, Any]:
    """The JSON object a streamed request was answered with."""
    raw = await response.aread()
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise response_invalid(provider, f"the body is not JSON ({err})") from None
    if not isinstance(body, dict):
        raise response_invalid(provider, f"expected a JSON object, got {raw[:200]!r}")
    return body


def send_whole(sink: DeltaSink, message: Message) -> None:
    """A whole answer's text and tool calls to the live stream, at once, so that watchers see
    what they would have seen streamed."""
    if message.text:
        sink.text(message.text)
    for call_id, call in (message.tool_calls or {}).items():
        sink.tool_call(call.name, call_id)


def no_events(response: Response) -> str:
    """What a stream that gave no answer at all was, for ``stream_incomplete``."""
    media_type = str(response.headers.get("content-type") or "no content type").split(";", 1)[0]
    if media_type.strip().lower() == "text/event-stream":
        return "ended before any answer"
    return f"came as {media_type.strip()[:100]}, not as events"


def stream_incomplete(provider: str, base_url: object, what: str) -> ApplicationError:
    """The error for a stream that ended before its answer was complete. ``provider`` is the
    provider's config key; only the host of ``base_url`` is shown (never a path or userinfo)."""
    return ApplicationError(
        f"{provider}: the streamed answer from {host_of(base_url)} {what}, so it may be cut "
        f"short. If this server does not stream, turn streaming off for it: "
        f"`{provider}: {{streaming: false}}` in the worker's config.",
        type=STREAM_INCOMPLETE,
        non_retryable=True,
    )


def host_of(base_url: object) -> str:
    parts = urlsplit(str(base_url))
    host = parts.hostname or "the server"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host
