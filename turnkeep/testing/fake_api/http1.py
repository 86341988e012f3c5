"""HTTP/1.1 on asyncio streams, as little of it as the fake API needs: read a request, send a
response or a stream of server-sent events, and notice a client that hung up meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any

from turnkeep.testing.fake_api.steps import Answer
from turnkeep.testing.fake_api.wire import Event

# How long a held answer waits at most (for a test that failed), and how often it looks.
HOLD_POLLS = 6000
HOLD_POLL_SECONDS = 0.02


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], Any] | None:
    line = await reader.readline()
    if not line.strip():
        return None
    _method, path, _version = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raw = await reader.readexactly(int(headers.get("content-length", "0")))
    text = raw.decode("utf-8", errors="replace")
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = text
    return path, headers, body


async def sleep_unless_hung_up(seconds: float, reader: asyncio.StreamReader) -> bool:
    """Sleep; False as soon as the client closes the connection (it timed out) instead."""
    hangup = asyncio.ensure_future(reader.read(1))
    try:
        done, _ = await asyncio.wait({hangup}, timeout=seconds)
        return not done
    finally:
        hangup.cancel()
        # Awaited out, so the connection's next read does not find this one still waiting.
        await asyncio.gather(hangup, return_exceptions=True)


async def hold_unless_hung_up(hold: threading.Event, reader: asyncio.StreamReader) -> bool:
    """Wait until ``hold`` is set; False as soon as the client closes the connection instead."""
    return await _held(hold, functools.partial(sleep_unless_hung_up, reader=reader))


async def _held(hold: threading.Event, sleep: Callable[[float], Awaitable[bool]]) -> bool:
    """Wait (a bounded two minutes) until ``hold`` is set, ``sleep``ing between looks; False as
    soon as a ``sleep`` says the client hung up."""
    for _ in range(HOLD_POLLS):
        if hold.is_set():
            break
        if not await sleep(HOLD_POLL_SECONDS):
            return False
    return True


async def send(
    writer: asyncio.StreamWriter,
    status: int,
    body: Any,
    headers: Mapping[str, str] | None = None,
    content_type: str = "application/json",
) -> None:
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Overloaded" if status == 529 else "Unknown"
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"content-type: {content_type}",
        f"content-length: {len(data)}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
    await writer.drain()


async def stream(
    writer: asyncio.StreamWriter,
    reader: asyncio.StreamReader,
    answer: Answer,
    events: list[Event],
    headers: Mapping[str, str],
) -> bool:
    """Send ``events`` as server-sent events (chunked), ``answer.chunk_delay`` apart, the last
    text chunk only once ``answer.hold`` is set; False when the client hung up meanwhile."""
    lines = [
        "HTTP/1.1 200 OK",
        "content-type: text/event-stream",
        "transfer-encoding: chunked",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    last_text = max((i for i, (_, _, text) in enumerate(events) if text), default=-1)
    # One read for the whole stream notices a hang-up (a client that gave up, or died); it is
    # awaited out before the connection's next request is read.
    hangup = asyncio.ensure_future(reader.read(1))

    async def wait(seconds: float) -> bool:
        done, _ = await asyncio.wait({hangup}, timeout=seconds)
        return not done

    try:
        for index, (name, body, _) in enumerate(events):
            if index and answer.chunk_delay and not await wait(answer.chunk_delay):
                return False
            hold = answer.hold if index == last_text else None
            if hold is not None and not await _held(hold, wait):
                return False
            data = body if isinstance(body, str) else json.dumps(body)
            event = (f"event: {name}\n" if name else "") + f"data: {data}\n\n"
            chunk = event.encode()
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
            if answer.sent is not None and events[index][2]:
                answer.sent.append(time.monotonic())
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
    finally:
        hangup.cancel()
        with contextlib.suppress(BaseException):
            await hangup
