"""A FastMCP server whose tools ask the client something during the call, the way a
2026-07-28 server does (an ``InputRequiredResult``, SEP-2322), and on an older connection by a
request of their own (``ctx.elicit``): ``book`` asks a person to confirm a booking with a form
(name, seats); ``summarise`` asks the client's model for a summary (sampling). Over stdio, or
streamable HTTP with ``--http PORT``.

Every run of a tool is appended to ``$TURNKEEP_TEST_RECORD`` (one line: the tool and what it
got), so a test sees how often the server ran it."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

import mcp_types as t
from fastmcp import Context, FastMCP

mcp = FastMCP("asking")

BOOKING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name"},
        "seats": {"type": "integer", "title": "Seats", "minimum": 1},
    },
    "required": ["name", "seats"],
}


def _record(line: str) -> None:
    path = os.environ.get("TURNKEEP_TEST_RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


@mcp.tool
async def book(ctx: Context, show: str) -> Any:
    """Book seats for a show, once the user confirms who and how many."""
    answers = ctx.input_responses
    _record(f"book {show} {'answered' if answers else 'asking'}")
    if not answers:
        return t.InputRequiredResult(
            input_requests={
                "confirm": t.ElicitRequest(
                    params=t.ElicitRequestFormParams(
                        message=f"Who is booking for {show}, and how many seats?",
                        requested_schema=BOOKING_SCHEMA,
                    )
                )
            }
        )
    answer = answers["confirm"]
    if not isinstance(answer, t.ElicitResult):
        return "not booked: unexpected answer"
    if answer.action != "accept" or not answer.content:
        return f"not booked: {answer.action}"
    return f"booked {answer.content['seats']} seats for {answer.content['name']} at {show}"


@dataclass
class Booking:
    name: str
    seats: int


@mcp.tool
async def book_push(ctx: Context, show: str) -> str:
    """``book`` the way FastMCP's docs show: a request of its own (``elicitation/create``)
    while the call waits, which only a connection opened with the initialize handshake
    carries."""
    answer = await ctx.elicit(f"Who is booking for {show}?", Booking)
    _record(f"book_push {show} {answer.action}")
    if answer.action != "accept":
        return f"not booked: {answer.action}"
    return f"booked {answer.data.seats} seats for {answer.data.name} at {show}"


@mcp.tool
async def summarise(ctx: Context, text: str) -> Any:
    """Summarise ``text`` with the client's model."""
    answers = ctx.input_responses
    _record(f"summarise {'answered' if answers else 'asking'}")
    if not answers:
        request = t.CreateMessageRequest(
            params=t.CreateMessageRequestParams(
                messages=[
                    t.SamplingMessage(
                        role="user", content=t.TextContent(type="text", text=f"Summarise: {text}")
                    )
                ],
                system_prompt="Answer in five words.",
                max_tokens=50,
            )
        )
        return t.InputRequiredResult(input_requests={"summary": request})
    answer = answers["summary"]
    content = getattr(answer, "content", None)
    return f"summary: {getattr(content, 'text', '?')}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    port = parser.parse_args().http
    if port is None:
        mcp.run(show_banner=False)
    else:
        mcp.run(transport="http", host="127.0.0.1", port=port, show_banner=False)
