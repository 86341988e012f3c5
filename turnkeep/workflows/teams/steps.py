"""What every workflow agent's steps share: how a step is run (a child turn of another agent)
and how the workflow agent's own model is asked, and the answers a step's result makes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from turnkeep.contract.activity_io import AgentTool
from turnkeep.contract.messages import CallToolResult, Message, StopReason, TextContent
from turnkeep.workflows.agent_tools import AgentCall


class StepRunner(Protocol):
    """Runs one step: an agent on messages, as the child turn with the given step and name,
    asking it for JSON of ``structured_output`` when given."""

    def __call__(
        self,
        tool: AgentTool,
        messages: list[Message],
        step: int,
        name: str,
        structured_output: dict[str, Any] | None = None,
    ) -> Awaitable[AgentCall]: ...


# Asks the workflow agent's own model (a router's, a planner's) about messages, for JSON of
# this schema (None: text).
ModelAsker = Callable[[list[Message], dict[str, Any] | None], Awaitable[Message]]


def failed(what: str, result: CallToolResult) -> Message:
    """The workflow agent's answer when a step failed: an ``error`` message saying which."""
    text = f"{what}: {result.text}"
    return Message(
        role="assistant",
        content=[TextContent(text=text)],
        channels={"error": [TextContent(text=text)]},
        stop_reason=StopReason.ERROR,
    )


def answer(result: CallToolResult) -> Message:
    """The workflow agent's answer that is a step's result."""
    return Message(role="assistant", content=result.content, stop_reason=StopReason.END_TURN)


def request(messages: list[Message]) -> str:
    """The text of the last of the turn's new messages: the request the steps answer."""
    return messages[-1].text if messages else ""
