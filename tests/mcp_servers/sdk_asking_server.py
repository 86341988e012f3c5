"""A server built on MCP's own Python SDK (``MCPServer``, stdio) whose tools ask the way that
SDK's docs show, with requests of their own while the call waits: ``book`` a person
(``ctx.elicit`` with a pydantic model), ``summarise`` the client's model
(``ctx.session.create_message``)."""

from __future__ import annotations

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import SamplingMessage, TextContent
from pydantic import BaseModel

mcp = MCPServer("sdk-asking")


class Booking(BaseModel):
    name: str
    seats: int


@mcp.tool()
async def book(ctx: Context, show: str) -> str:
    """Book seats for a show, once the user says who and how many."""
    result = await ctx.elicit(f"Who is booking for {show}?", Booking)
    if result.action != "accept":
        return f"not booked: {result.action}"
    return f"booked {result.data.seats} seats for {result.data.name} at {show}"


@mcp.tool()
async def summarise(ctx: Context, text: str) -> str:
    """Summarise ``text`` with the client's model."""
    prompt = SamplingMessage(
        role="user", content=TextContent(type="text", text=f"Summarise: {text}")
    )
    result = await ctx.session.create_message(
        [prompt], max_tokens=50, system_prompt="Answer in five words."
    )
    return f"summary: {getattr(result.content, 'text', '?')}"


if __name__ == "__main__":
    mcp.run()
