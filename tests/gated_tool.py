"""A function tool for the shutdown tests (``function_tools: {gate: ["tests.gated_tool:hold"]}``):
it records each execution in a file and holds until the test lets it finish, so a test can
signal the worker while the call is certainly in flight."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

# A call nobody releases gives up after this long, so a failed test leaves no worker hanging.
HOLD_AT_MOST = 300.0

# A plain logger, not the SDK's activity logger: the worker's log lines still name the call.
log = logging.getLogger(__name__)


def _log(record: str, event: str, tag: str) -> None:
    line = json.dumps({"event": event, "tag": tag, "pid": os.getpid(), "at": time.time()})
    # One short O_APPEND write per line: lines from several processes never mix.
    with open(record, "a", encoding="utf-8") as f:
        f.write(line + "\n")


async def hold(tag: str, record: str, release: str) -> str:
    """Record a start, wait until the file `release` exists, record the end and return."""
    _log(record, "start", tag)
    log.info("holding %s", tag)
    deadline = time.monotonic() + HOLD_AT_MOST
    while not await asyncio.to_thread(Path(release).exists):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{tag} was never released")
        await asyncio.sleep(0.05)
    _log(record, "done", tag)
    return f"{tag} released"
