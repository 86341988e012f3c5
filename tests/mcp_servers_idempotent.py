"""A stdio MCP server with one side-effecting tool that logs every execution, for durability tests.

``effect`` appends JSON lines to the file named by $TURNKEEP_TEST_RECORD:
``start`` when a call begins, ``applied`` when it performs its side effect, ``skipped`` when it
recognises a call it already performed (``dedupe=true``), ``done`` when it returns. Each line
carries the idempotency key turnkeep sends in the request's ``_meta``
(``turnkeep/idempotency_key``), this server's pid and its parent's pid (the worker process), so
tests can count executions across processes and see which worker ran each attempt.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from fastmcp import Context, FastMCP

IDEMPOTENCY_KEY_META = "turnkeep/idempotency_key"

mcp = FastMCP("effects")

# The worker that started this server, read once at start: a request the worker wrote just
# before it was killed can be read after, when this process has been re-parented already.
WORKER = os.getppid()


def _log(event: str, tag: str, key: str | None, worker: int) -> None:
    line: dict[str, Any] = {"event": event, "tag": tag, "key": key, "at": time.time()}
    line.update(pid=os.getpid(), worker=worker)
    # One short O_APPEND write per line: lines from concurrent calls and processes never mix.
    with open(os.environ["TURNKEEP_TEST_RECORD"], "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _applied_before(key: str) -> bool:
    try:
        with open(os.environ["TURNKEEP_TEST_RECORD"], encoding="utf-8") as f:
            entries: list[dict[str, Any]] = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return False
    return any(e["event"] == "applied" and e["key"] == key for e in entries)


@mcp.tool
async def effect(ctx: Context, tag: str, seconds: float = 0.0, dedupe: bool = False) -> str:
    """Perform a side effect named `tag`, then take `seconds` to return."""
    rc = ctx.request_context
    key = (rc.meta or {}).get(IDEMPOTENCY_KEY_META) if rc is not None else None
    worker = WORKER
    _log("start", tag, key, worker)
    if dedupe and key is not None and _applied_before(key):
        _log("skipped", tag, key, worker)
        return f"{tag} done"
    _log("applied", tag, key, worker)
    await asyncio.sleep(seconds)
    _log("done", tag, key, worker)
    return f"{tag} done"


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
