"""The one server-sent-events encoder (``turnkeep.support.sse``): what it writes is read back
as written, by the reader turnkeep's client uses, however the bytes are cut into chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest

from turnkeep.support.sse import encode_comment, encode_event

EVENTS = [
    ("delta", "QUJD", None),
    ("message", '{"text":"two\\nlines"}', 0),
    ("text", "a real\nline break\r\nand another\rone", 1),
    ("end", "", None),
]


def test_lines_end_in_lf() -> None:
    assert encode_event("end") == b"event: end\ndata:\n\n"
    assert encode_event("message", "{}", event_id=7) == b"event: message\nid: 7\ndata: {}\n\n"
    assert encode_comment("ping") == b": ping\n\n"


@pytest.mark.asyncio
@pytest.mark.parametrize("chunk", [1, 2, 7, 1 << 16])
async def test_events_read_back_as_written(chunk: int) -> None:
    body = encode_comment("ping").join(
        encode_event(kind, data, event_id=event_id) for kind, data, event_id in EVENTS
    )

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), chunk):
            yield body[start : start + chunk]

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=pieces())

    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as http,
        http.sse("http://stream.test/") as source,
    ):
        got = [(event.event, event.data, event.id) async for event in source]
    # A reader keeps the last id it was given until another comes.
    ids = ["", "0", "1", "1"]
    expected = [
        (kind, data.replace("\r\n", "\n").replace("\r", "\n"), i)
        for (kind, data, _), i in zip(EVENTS, ids, strict=True)
    ]
    assert got == expected
