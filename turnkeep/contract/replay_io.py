"""What a counterfactual replay's workflow and its ``replay_source`` activity exchange: the
source turn's input and its recorded tool calls, as the worker read them from the source's own
history (never from a client, which could claim any result)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from turnkeep.contract.compact import Compact
from turnkeep.contract.messages import CallToolResult, Message
from turnkeep.contract.turn_io import ReplayOf

REPLAY_SOURCE = "replay_source"

# The error type of a replay that cannot start: an unknown source, one still running, one of
# an agent the worker does not serve, live tools its agent does not allow.
REPLAY_REFUSED = "ReplayRefused"


class ReplaySourceRequest(Compact):
    # The replay's own agent: live tools and an instruction are checked against its config.
    agent: str
    replay: ReplayOf


class RecordedCall(Compact):
    """One tool call of the source turn and the result it got."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: CallToolResult

    @property
    def key(self) -> str:
        return call_key(self.name, self.arguments)


class ReplaySource(Compact):
    """The source turn as its replay starts from it."""

    agent: str  # the source's agent
    messages: list[Message]  # its input messages
    history: list[Message] = Field(default_factory=list)  # the conversation before them
    calls: list[RecordedCall] = Field(default_factory=list)  # in the order they were made
    # Whether unmatched calls run for real (asked for, and allowed by the replay's agent).
    live_tools: bool = False
    # The replay's system prompt in place of its agent's (checked against its `overrides`).
    instruction: str | None = None


def call_key(name: str, arguments: dict[str, Any]) -> str:
    """What two calls must share to match: the tool's name and its arguments, compared as
    canonical JSON (key order does not count, values do)."""
    return json.dumps([name, arguments], sort_keys=True, separators=(",", ":"), default=str)


def recorded_calls(messages: list[Message]) -> list[RecordedCall]:
    """The tool calls in ``messages`` that got a result, in the order they were asked for."""
    results: dict[str, CallToolResult] = {}
    for message in messages:
        results.update(message.tool_results or {})
    return [
        RecordedCall(name=call.name, arguments=call.arguments, result=results[call_id])
        for message in messages
        for call_id, call in (message.tool_calls or {}).items()
        if call_id in results
    ]
