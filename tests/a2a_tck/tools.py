"""The TCK fixture agent's one tool (a FastMCP server, stdio): ``ask`` puts a question to the
user and returns the answer, so the task waits for input (A2A's ``input-required``) until the
client's next message in it answers."""

from __future__ import annotations

from typing import Any

import mcp_types as t
from fastmcp import Context, FastMCP

mcp = FastMCP("tck")

ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "title": "Answer"}},
    "required": ["answer"],
}


@mcp.tool
async def ask(ctx: Context, question: str) -> Any:
    """Ask the user ``question``; returns the answer."""
    answers = ctx.input_responses
    if not answers:
        request = t.ElicitRequest(
            params=t.ElicitRequestFormParams(message=question, requested_schema=ANSWER_SCHEMA)
        )
        return t.InputRequiredResult(input_requests={"answer": request})
    answer = answers["answer"]
    if not isinstance(answer, t.ElicitResult) or answer.action != "accept" or not answer.content:
        return "no answer"
    return str(answer.content["answer"])


if __name__ == "__main__":
    mcp.run(show_banner=False)
