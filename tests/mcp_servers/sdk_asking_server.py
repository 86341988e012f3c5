"""A server built on MCP's own Python SDK (``MCPServer``, stdio) whose tool asks the way that
SDK's docs show: ``ctx.elicit`` with a pydantic model, a request of its own while the call
waits."""

from __future__ import annotations

from mcp.server.mcpserver import Context, MCPServer
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


if __name__ == "__main__":
    mcp.run()
