"""Heartbeating while an activity waits on something slow (a model, a tool).

A heartbeat is how Temporal learns, within the heartbeat timeout rather than the start-to-close
timeout, that the worker running an activity died, and how the activity learns it was cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")


def heartbeat_interval() -> float:
    """A third of the activity's heartbeat timeout, so one lost beat is not fatal."""
    timeout = activity.info().heartbeat_timeout
    return max(0.2, timeout.total_seconds() / 3) if timeout else 10.0


def first_beat_delay(interval: float) -> float:
    """Seconds to wait before the first beat: until one interval after the server started this
    attempt, by its ``started_time``, never longer than one interval from now.

    The server's heartbeat timeout runs from when the worker took the task, which on a loaded
    worker can be well before this code runs: waiting one interval *from here* let a busy, live
    worker miss its first deadline and run a tool twice (seen in the chaos test). Counting from
    the server's start time keeps the first beat inside the deadline, and a step shorter than
    one interval (most tool calls, every scripted model call) sends no heartbeat at all, saving
    a server call per step. A worker clock behind the server's can only shorten the wait to
    the old one-interval-from-now; one ahead of it only sends the beat earlier."""
    elapsed = (datetime.now(UTC) - activity.info().started_time).total_seconds()
    return min(interval, max(0.0, interval - elapsed))


async def heartbeating(work: Awaitable[T], *details: object) -> T:
    """Await ``work`` while heartbeating; cancelling the activity cancels ``work``.

    Beats start after ``first_beat_delay`` and then come every interval. A cancellation
    reaches the activity in the answer to the next beat, as it did when the first beat went
    out at once (a beat at the very start could only ever see a cancellation that came before
    the step began)."""
    task = asyncio.ensure_future(work)
    interval = heartbeat_interval()
    wait = first_beat_delay(interval)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                return task.result()
            activity.heartbeat(*details)
            wait = interval
    finally:
        if not task.done():
            task.cancel()
            # Let the cancelled work unwind (e.g. an MCP cancel notification) before we return.
            await asyncio.gather(task, return_exceptions=True)
