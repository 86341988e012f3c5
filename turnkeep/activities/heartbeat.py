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

    ``work`` runs in the activity's own task, so a cancellation reaches it directly and it has
    unwound (an MCP cancel notification sent, say) before this returns. The beats come from
    timer callbacks on the event loop: a callback runs in a copy of the context it was
    scheduled from, the activity's, which is how ``activity.heartbeat`` knows the activity.
    They start after ``first_beat_delay`` and then come every interval. A cancellation reaches
    the activity in the answer to the next beat (a beat at the very start could only ever see
    a cancellation that came before the step began). No task or wait of its own: a quick step,
    which sends no beat, costs one timer scheduled and cancelled."""
    loop = asyncio.get_running_loop()
    interval = heartbeat_interval()
    timer: asyncio.TimerHandle

    def beat() -> None:
        nonlocal timer
        activity.heartbeat(*details)
        timer = loop.call_later(interval, beat)

    timer = loop.call_later(first_beat_delay(interval), beat)
    try:
        return await work
    finally:
        timer.cancel()
