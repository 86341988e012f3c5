"""The interrupted-tool-result repair (fast-agent's ``reconcile_interrupted_history``).

A conversation that ends on an assistant ``toolUse`` message without results is one no provider
will accept. Repair answers every open call id in one appended user message: with the real
result where the tool finished, otherwise with the interrupted marker.
"""

from __future__ import annotations

from turnkeep.contract.messages import CallToolResult, Message, StopReason
from turnkeep.contract.turn_io import RollbackState

INTERRUPTED_TEXT = "**The user interrupted this tool call**"


def dangling_tool_request(conversation: list[Message]) -> Message | None:
    """The last message if it is a tool request nobody answered yet."""
    if not conversation:
        return None
    last = conversation[-1]
    if last.role == "assistant" and last.stop_reason == StopReason.TOOL_USE and last.tool_calls:
        return last
    return None


def repair_dangling_tool_calls(
    conversation: list[Message], completed: dict[str, CallToolResult]
) -> tuple[Message | None, RollbackState]:
    """The message that closes a dangling tool request (or None), and what was done."""
    if not conversation:
        return None, RollbackState.HISTORY_EMPTY
    request = dangling_tool_request(conversation)
    if request is None or request.tool_calls is None:
        return None, RollbackState.HISTORY_UNCHANGED
    results = {
        call_id: completed.get(call_id) or CallToolResult.error(INTERRUPTED_TEXT)
        for call_id in request.tool_calls
    }
    interrupted = any(call_id not in completed for call_id in request.tool_calls)
    state = (
        RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
        if interrupted
        else RollbackState.APPENDED_COMPLETED_TOOL_RESULT
    )
    return Message(role="user", tool_results=results), state
