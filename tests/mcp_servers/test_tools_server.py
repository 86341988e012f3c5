"""An MCP server for tests, over stdio (default) or streamable HTTP (``--http PORT``)."""

from __future__ import annotations

import argparse
import asyncio
import os

from fastmcp import FastMCP

mcp = FastMCP("test-tools")


@mcp.tool
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@mcp.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool
def fail(message: str) -> str:
    """Raise an error with the given message."""
    raise RuntimeError(message)


@mcp.tool
async def slow(seconds: float) -> str:
    """Sleep for the given number of seconds, then say so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@mcp.tool
def record(tag: str) -> str:
    """Append the tag and a newline to the file named by $TURNKEEP_TEST_RECORD."""
    # Tests count lines in this file to see how many times a tool really ran.
    with open(os.environ["TURNKEEP_TEST_RECORD"], "a", encoding="utf-8") as f:
        f.write(tag + "\n")
    return tag


@mcp.tool
def big(n_bytes: int) -> str:
    """Return n_bytes of text."""
    return ("0123456789abcdef" * (n_bytes // 16 + 1))[:n_bytes]


@mcp.tool
def pid() -> int:
    """The server's process id, so tests can kill it."""
    return os.getpid()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    args = parser.parse_args()
    if args.http is None:
        mcp.run(transport="stdio", show_banner=False)
    else:
        mcp.run(
            transport="http",
            host="127.0.0.1",
            port=args.http,
            show_banner=False,
            log_level="WARNING",
        )


if __name__ == "__main__":
    main()
