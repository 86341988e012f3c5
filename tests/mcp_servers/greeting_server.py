"""A FastMCP server (stdio) written the everyday way: its one tool asks the user a question
with ``await ctx.elicit(...)`` in the middle of the call, as FastMCP's and MCP's own docs show.

``greet`` appends one JSON line per run to ``$TURNKEEP_TEST_RECORD``: ``asked`` with the
answer's action once ``ctx.elicit`` returns, then ``greeted`` when it makes its one side effect
(only on an accepted answer). Each line carries the call's idempotency key and the pid of
the worker that started the server, so a test can count side effects across worker processes."""

from __future__ import annotations

import json
import os
from typing import Any

from fastmcp import Context, FastMCP

IDEMPOTENCY_KEY_META = "turnkeep/idempotency_key"

mcp = FastMCP("greeting")

# The worker that started this server, read once at start (a killed worker's server is
# re-parented).
WORKER = os.getppid()


def _record(event: str, key: str | None, **fields: Any) -> None:
    line = json.dumps({"event": event, "key": key, "worker": WORKER, **fields})
    # One short O_APPEND write per line: lines from several processes never mix.
    with open(os.environ["TURNKEEP_TEST_RECORD"], "a", encoding="utf-8") as f:
        f.write(line + "\n")


@mcp.tool
async def greet(ctx: Context, guest: str) -> str:
    """Welcome a guest, once the user says who is welcoming them."""
    rc = ctx.request_context
    key = (rc.meta or {}).get(IDEMPOTENCY_KEY_META) if rc is not None else None
    answer = await ctx.elicit(f"Who welcomes {guest}?", response_type=str)
    _record("asked", key, action=answer.action)
    if answer.action != "accept":
        return f"nobody welcomed {guest}: {answer.action}"
    _record("greeted", key, guest=guest, host=answer.data)
    return f"{answer.data} welcomed {guest}"


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
