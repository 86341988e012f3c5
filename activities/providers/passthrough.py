"""fast-agent's ``passthrough`` model: no key, no network, fully predictable.

- a line ``***CALL_TOOL <name> [json]`` asks for that tool (several lines, several calls);
- a message carrying tool results is answered with the results' text;
- anything else is echoed back.
"""

from __future__ import annotations

from activities.parsed_messages import estimate_tokens
from activities.providers import with_usage
from activities.providers.convert import tool_call
from workflows.activity_io import LlmRequest
from workflows.messages import Message, StopReason, TextContent, ToolCall
from workflows.turn_io import Usage

CALL_TOOL = "***CALL_TOOL"


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
    echoed = list(last.content) or [TextContent(text="")]
    return Message(role="assistant", content=echoed, stop_reason=StopReason.END_TURN)


class PassthroughProvider:
    async def complete(self, request: LlmRequest, model_name: str) -> Message:
        reply = answer(request)
        usage = Usage(
            input_tokens=estimate_tokens(request.messages), output_tokens=estimate_tokens([reply])
        )
        return with_usage(reply, usage)

    async def aclose(self) -> None:
        pass  # no connections
