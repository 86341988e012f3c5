"""A server that asks with a request of its own where no such request can travel: how to tell
from a tool call's outcome, and the words that name the fix.

MCP 2026-07-28 gives a server no channel for requests of its own during a call: a tool asks by
returning an ``InputRequiredResult`` (SEP-2322). ``ctx.elicit`` in FastMCP and in MCP's own
SDK sends an ``elicitation/create`` while the call waits, which only a connection opened with
the initialize handshake (2025-11-25 and older) carries; on a 2026-07-28 connection the SDK
fails the call instead, FastMCP with an error result, MCP's SDK with a JSON-RPC error. Both
say "server-initiated requests"."""

from __future__ import annotations

from typing import Literal

import mcp.types
from mcp.shared.exceptions import MCPError

AskedKind = Literal["elicitation", "sampling"]
Outcome = mcp.types.CallToolResult | MCPError

_MARK = "server-initiated request"


def refused_request(outcome: Outcome) -> AskedKind | None:
    """What the server tried to ask with a request of its own, if the call failed because the
    connection could not carry it."""
    if isinstance(outcome, MCPError):
        text = outcome.message
    elif outcome.is_error:
        text = " ".join(b.text for b in outcome.content if isinstance(b, mcp.types.TextContent))
    else:
        return None
    text = text.lower()
    if _MARK not in text:
        return None
    return "sampling" if "sampling" in text else "elicitation"


def fix_for(server: str, kind: AskedKind, *, enabled: bool, protocol_mode: str) -> str:
    """What to change so that ``server``'s request gets through: said to the model and the
    person reading the turn, who are the ones to pass it on."""
    where = f"`mcp.servers.{server}`"
    if not enabled:
        key = "elicitation: {mode: forms}" if kind == "elicitation" else "sampling: {}"
        return (
            f"turnkeep: MCP server {server!r} asked for {_what(kind)} with a request of its own, "
            f"and its config does not let it ask: add `{key}` to {where}."
        )
    if protocol_mode == "modern":
        return (
            f"turnkeep: MCP server {server!r} asked for {_what(kind)} with a request of its own, "
            "which a 2026-07-28 connection cannot carry: set `protocol_mode: auto` (or "
            f"`legacy`) on {where}."
        )
    return (
        f"turnkeep: MCP server {server!r} asked for {_what(kind)} with a request of its own, "
        "and no connection to it could carry one (only one opened with the initialize "
        "handshake can, over a transport with a channel back): its tool must ask by returning "
        "an InputRequiredResult."
    )


def with_fix(outcome: Outcome, fix: str) -> Outcome:
    """``outcome`` with ``fix`` after what the server said."""
    if isinstance(outcome, MCPError):
        return MCPError(outcome.code, f"{outcome.message} ({fix})", outcome.data)
    block = mcp.types.TextContent(type="text", text=fix)
    return outcome.model_copy(update={"content": [*outcome.content, block]})


def _what(kind: AskedKind) -> str:
    return "a person's answer" if kind == "elicitation" else "a model's answer"
