"""fast-agent's ``passthrough`` model: no key, no network, fully predictable.

- a message carrying tool results is answered with the results' text;
- a line ``***CALL_TOOL <name> [json]`` in the last message asks for that tool (several lines,
  several calls);
- a line ``***FIXED_RESPONSE <text>`` in a user message makes ``<text>`` the answer from then on;
- anything else is echoed back: the text of every trailing user message, joined by newlines.

fast-agent keeps the fixed response on the model object. A durable turn cannot: its next model
call may run on another worker, after a restart. So it is read from the conversation itself,
the latest such line of a user message the model is sent, which every worker sees the same.
"""

from __future__ import annotations

from turnkeep.contract.messages import Message, StopReason, ToolCall
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.turn_io import Usage
from turnkeep.providers.base import ModelProvider, with_usage
from turnkeep.providers.convert import tool_call
from turnkeep.providers.parsed_messages import estimate_tokens

CALL_TOOL = "***CALL_TOOL"
FIXED_RESPONSE = "***FIXED_RESPONSE"


def parse_tool_call(line: str) -> ToolCall:
    name, _, raw = line.removeprefix(CALL_TOOL).strip().partition(" ")
    return tool_call(name, raw)


def answer(request: LlmRequest) -> Message:
    last = request.messages[-1] if request.messages else Message.user("")
    if last.tool_results:
        text = "\n".join(result.text for result in last.tool_results.values())
        return Message.assistant(text)
    lines = [line for line in last.text.splitlines() if line.startswith(CALL_TOOL)]
    if lines:
        calls = {
            f"call_{request.call_index}_{n}": parse_tool_call(line)
            for n, line in enumerate(lines, start=1)
        }
        return Message(role="assistant", tool_calls=calls, stop_reason=StopReason.TOOL_USE)
    # As in fast-agent, a bare ``***FIXED_RESPONSE`` line (no text) switches echoing back on.
    return Message.assistant(
        fixed_response(request.messages) or trailing_user_text(request.messages)
    )


def fixed_response(conversation: list[Message]) -> str | None:
    """The text of the latest ``***FIXED_RESPONSE`` line of a user message, if any."""
    for message in reversed(conversation):
        if message.role != "user":
            continue
        for line in reversed(message.text.splitlines()):
            if line.startswith(FIXED_RESPONSE):
                return line.removeprefix(FIXED_RESPONSE).strip()
    return None


def trailing_user_text(conversation: list[Message]) -> str:
    """The user messages after the last assistant message, joined by newlines. fast-agent sees
    only the turn's new messages; this model sees the whole conversation, so a results-only
    message closing the previous turn is left out rather than echoed as a blank line."""
    trailing: list[str] = []
    for message in reversed(conversation):
        if message.role != "user":
            break
        if message.text:
            trailing.append(message.text)
    return "\n".join(reversed(trailing))


class PassthroughProvider(ModelProvider):
    name = "passthrough"
    bare = True
    context_window = 200_000

    async def complete(self, request: LlmRequest, model_name: str) -> Message:
        reply = answer(request)
        usage = Usage(
            input_tokens=estimate_tokens(request.messages), output_tokens=estimate_tokens([reply])
        )
        return with_usage(reply, usage)
