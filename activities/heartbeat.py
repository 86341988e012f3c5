"""Heartbeating while an activity waits on something slow (a model, a tool).

A heartbeat is how Temporal learns, within the heartbeat timeout rather than the start-to-close
timeout, that the worker running an activity died, and how the activity learns it was cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")


def heartbeat_interval() -> float:
    """A third of the activity's heartbeat timeout, so one lost beat is not fatal."""
    timeout = activity.info().heartbeat_timeout
    return max(0.2, timeout.total_seconds() / 3) if timeout else 10.0


async def heartbeating(work: Awaitable[T], *details: object) -> T:
    """Await ``work`` while heartbeating; cancelling the activity cancels ``work``.

    The first beat goes out at once: the server's heartbeat timeout runs from when the worker
    took the task, which on a loaded worker can be well before this code runs. Waiting one
    interval first saved ~6 ms per quick step but let a busy, live worker miss its first
    deadline and run a tool twice (seen in the chaos test)."""
    task = asyncio.ensure_future(work)
    interval = heartbeat_interval()
    try:
        while True:
            activity.heartbeat(*details)
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()
            # Let the cancelled work unwind (e.g. an MCP cancel notification) before we return.
            await asyncio.gather(task, return_exceptions=True)
