"""Server-sent events as bytes: the one encoder for every event stream turnkeep serves (the
worker's live text, the gateway's turn and session streams).

Lines end in LF. The event-stream format lets a line end in LF, CRLF or CR, and every reader
turnkeep's streams meet reads LF: browsers' ``EventSource``, httpx's SSE reader (turnkeep's
own client, the tests), the A2A and MCP SDKs' clients, and the gateway page's own reader. That
page splits lines as chunks arrive, and so do many hand-written readers: a CRLF cut between two
chunks reads there as a line break and then an empty line, which ends the event early. LF has
no such seam.
"""

from __future__ import annotations

import re

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def encode_event(kind: str, data: str = "", *, event_id: int | str | None = None) -> bytes:
    """One event: its ``event`` line, its ``id`` line when given, a ``data`` line per line of
    ``data`` (a reader joins them with line breaks again), and the empty line that ends it."""
    lines = [f"event: {kind}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines += [f"data: {line}" if line else "data:" for line in _LINE_BREAK.split(data)]
    return ("\n".join(lines) + "\n\n").encode()


def encode_comment(text: str) -> bytes:
    """A comment, which readers skip: something to send on an idle stream so that proxies and
    clients keep it open."""
    return f": {text}\n\n".encode()
