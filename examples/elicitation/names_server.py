"""An MCP server whose tools ask the user during the call, as FastMCP's docs show."""

from dataclasses import dataclass

from fastmcp import Context, FastMCP

mcp = FastMCP("front-desk")


@mcp.tool
async def greet(ctx: Context) -> str:
    """Greet the user by name."""
    result = await ctx.elicit("What is your name?", response_type=str)
    if result.action == "accept":
        return f"Hello, {result.data}!"
    return f"No name given ({result.action})."


@dataclass
class Booking:
    name: str
    seats: int


@mcp.tool
async def book(ctx: Context, show: str) -> str:
    """Book seats for a show, once the user says who and how many."""
    result = await ctx.elicit(f"Who is booking for {show}?", response_type=Booking)
    if result.action != "accept":
        return f"Not booked ({result.action})."
    return f"Booked {result.data.seats} seats for {result.data.name} at {show}."


if __name__ == "__main__":
    mcp.run()
