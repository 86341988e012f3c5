"""Agents as tools (fast-agent's ``AgentsAsToolsAgent``), durably: a call of ``agent__<name>``
runs that agent's turn as a child workflow of the calling turn, with a history of its own that
the Web UI links to the call, and the child's final answer is the call's result.

A child workflow rather than an activity: the child's model and tool calls are each a step of
its own history, so a worker that dies mid-child resumes the child where it was and the
parent, which only waits, is not re-run; a cancelled parent cancels its running children, each
of which repairs its own conversation before the parent repairs its."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
)

from turnkeep.contract.activity_io import AgentTool, TurnPlan
from turnkeep.contract.messages import CallToolResult, Message, StopReason, TextContent
from turnkeep.contract.turn_io import TurnInput, TurnResult, Usage
from turnkeep.workflows.child_turn import start_turn_child

# fast-agent's answer when a child stops while still asking for tools and has said nothing.
BUDGET_EXHAUSTED = (
    "Runtime budget exhausted: child agent stopped while requesting another tool and produced "
    "no final content. Return a best-effort answer or retry with a larger budget."
)
# Room in a workflow id for the parent's id and the step: Temporal allows 1,000 bytes.
CALL_ID_CHARS = 100


class AgentCall(NamedTuple):
    result: CallToolResult
    # The child's usage by agent, then model (its own and that of the agents it called).
    usage: dict[str, dict[str, Usage]]


def agent_message(arguments: dict[str, Any]) -> str:
    """The child's user message, as fast-agent renders an agent tool's arguments: ``message``
    (or ``text``) when it is a string, else the arguments as they came."""
    for key in ("message", "text"):
        if isinstance(arguments.get(key), str):
            return str(arguments[key])
    return str(arguments) if arguments else ""


def child_id(parent_id: str, step: int, call_id: str) -> str:
    """The child turn's workflow id: the parent's, then the model call that asked and the call
    id, so an operator finds the child from the call and each call gets a turn of its own."""
    return f"{parent_id}/{step}/{call_id[:CALL_ID_CHARS]}"


async def run_agent(
    tool: AgentTool,
    messages: list[Message],
    *,
    id: str,
    depth: int,
    parent: TurnPlan,
    structured_output: dict[str, Any] | None = None,
) -> AgentCall:
    """Run ``tool``'s agent on ``messages`` as a child turn with workflow id ``id`` (asked for
    JSON of ``structured_output`` when given), at the ``parent`` turn's priority (which the
    child's own agent may lower further) and for its tenant. A cancelled caller cancels the
    child and waits for its repair, then raises ``CancelledError``; any other end is the
    child's answer (or failure) as a tool result."""
    turn = TurnInput(
        agent=tool.agent,
        messages=messages,
        depth=depth + 1,
        structured_output=structured_output,
        priority=parent.priority,
        tenant=parent.fairness_key,
    )

    async def run_child() -> TurnResult:
        child = await start_turn_child(turn, id=id, task_queue=tool.task_queue)
        return await child

    # Shielded, so a cancellation that reaches this call is the caller's own (the SDK absorbs
    # the one it passes on to the child): one that only reaches the child, from an operator,
    # comes back as the child's outcome and is the model's to hear about.
    child = asyncio.ensure_future(run_child())
    try:
        result = await asyncio.shield(child)
    except asyncio.CancelledError:
        child.cancel()
        await asyncio.gather(child, return_exceptions=True)
        raise
    except ChildWorkflowError as err:
        return AgentCall(CallToolResult.error(f"Error: {_failure(tool.agent, err)}"), {})
    return AgentCall(agent_result(result), team_usage(result, tool.agent))


def agent_result(result: TurnResult) -> CallToolResult:
    """A child turn's final answer as a tool result, as fast-agent makes it: the answer's
    content, then its ``error`` channel, which makes it an error."""
    final = result.final
    content = list(final.content) if final else []
    errors = list(final.channels.get("error", [])) if final and final.channels else []
    if not content and not errors and result.stop_reason in _STOPPED_FOR_TOOLS:
        errors = [TextContent(text=BUDGET_EXHAUSTED)]
    return CallToolResult(content=[*content, *errors], is_error=bool(errors))


_STOPPED_FOR_TOOLS = (StopReason.TOOL_USE, StopReason.MAX_ITERATIONS)


def team_usage(result: TurnResult, agent: str) -> dict[str, dict[str, Usage]]:
    """The usage of a turn of ``agent`` by agent, then model."""
    return result.usage_by_agent or ({agent: result.usage} if result.usage else {})


def _failure(agent: str, err: ChildWorkflowError) -> str:
    """Why the child turn failed, in the words of the failure at the bottom of it (an unknown
    agent, a depth past the limit), not of the wrappers around it."""
    cause = err.cause
    if isinstance(cause, CancelledError):
        return f"the turn of agent {agent!r} was cancelled"
    while isinstance(cause, (ActivityError, ChildWorkflowError)) and cause.cause is not None:
        cause = cause.cause
    if isinstance(cause, ApplicationError) and cause.type:
        return f"{cause.type}: {cause.message}"
    return cause.message if isinstance(cause, FailureError) else str(err)
