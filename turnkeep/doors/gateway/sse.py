"""A lean server-sent-events response: the frames a feed encoded, written as they come, with
one small task per connection that notices the client leaving. A watcher is mostly its
connection; sse-starlette's response (a task group of several tasks and its own ping timer per
connection) cost several times that, for a thousand watchers of one turn. Keep-alive comments
come from the feed, one timer for all its watchers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from starlette.types import Message, Receive, Scope, Send

HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-store",
    "x-accel-buffering": "no",  # a proxy (nginx) passes each event on at once
    "x-content-type-options": "nosniff",
}


class EventStream:
    """An ASGI response streaming ``frames`` until they end or the client leaves."""

    def __init__(
        self, frames: AsyncIterator[bytes], headers: Mapping[str, str] | None = None
    ) -> None:
        self.frames = frames
        self.headers = {**HEADERS, **(headers or {})}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.current_task()
        assert sender is not None
        listener = asyncio.create_task(_until_gone(receive, sender))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(k.encode(), v.encode()) for k, v in self.headers.items()],
                }
            )
            async for frame in self.frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (asyncio.CancelledError, OSError):
            # The client left (the listener cancelled us), or the server is going away.
            if not listener.done() or listener.cancelled():
                raise
            sender.uncancel()  # our own listener's doing: the response is simply over
        finally:
            listener.cancel()
            with contextlib.suppress(BaseException):
                await self.frames.aclose()  # type: ignore[attr-defined]


async def _until_gone(receive: Receive, sender: asyncio.Task[None]) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            sender.cancel()
            return
