"""What the ``compact_history`` activity asks the agent's model: a summary of the older part
of a conversation, written so the conversation can continue from it
(the documentation's *Compaction*)."""

from __future__ import annotations

import json

from turnkeep.contract.activity_io import CompactRequest
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import LlmRequest

INSTRUCTION = (
    "You compact conversations between a user and an AI assistant that uses tools. Write a "
    "summary that lets the assistant carry on without the original messages: the user's goals "
    "and constraints, decisions made, facts and figures learned from tool results, and what "
    "is still open. Be concise; do not invent anything."
)
MAX_RESULT_CHARS = 2_000  # per tool result: the gist, not the payload


def transcript(messages: list[Message]) -> str:
    """The conversation as plain text: summarising needs no tool protocol."""
    lines: list[str] = []
    for message in messages:
        if message.text:
            lines.append(f"{message.role}: {message.text}")
        for call_id, call in (message.tool_calls or {}).items():
            lines.append(
                f"assistant called {call.name} ({call_id}) with {json.dumps(call.arguments)}"
            )
        for call_id, result in (message.tool_results or {}).items():
            status = "error" if result.is_error else "result"
            lines.append(f"tool {status} ({call_id}): {result.text[:MAX_RESULT_CHARS]}")
    return "\n".join(lines)


def summary_request(request: CompactRequest) -> LlmRequest:
    prompt = "Summarise this conversation:\n\n" + transcript(request.messages)
    return LlmRequest(
        agent=request.agent,
        model=request.model,
        call_index=0,  # not one of the turn's model calls
        instruction=INSTRUCTION,
        messages=[Message.user(prompt)],
        tools=[],
    )
