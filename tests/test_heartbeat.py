"""When ``heartbeating`` sends its beats (``turnkeep.activities.heartbeat``), under the SDK's own
activity test environment: a quick step sends none, a slow one beats on time, and the first
deadline counts from when the server started the attempt, not from when the code began."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from turnkeep.activities.heartbeat import first_beat_delay, heartbeating


def environment(*, started_ago: float, timeout: float = 3.0) -> tuple[ActivityEnvironment, list]:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        heartbeat_timeout=timedelta(seconds=timeout),
        started_time=datetime.now(UTC) - timedelta(seconds=started_ago),
    )
    beats: list[tuple[object, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    return env, beats


async def test_a_quick_step_sends_no_heartbeat() -> None:
    env, beats = environment(started_ago=0.0)

    async def step() -> str:
        return await heartbeating(asyncio.sleep(0.05, result="done"), "working")

    assert await env.run(step) == "done"
    assert beats == []


async def test_a_slow_step_beats_every_interval() -> None:
    env, beats = environment(started_ago=0.0, timeout=0.9)  # interval: 0.3 s

    async def step() -> str:
        return await heartbeating(asyncio.sleep(1.0, result="done"), "working")

    assert await env.run(step) == "done"
    assert 2 <= len(beats) <= 4, beats
    assert beats[0] == ("working",)


@pytest.mark.parametrize(
    ("started_ago", "expected"),
    [
        (0.0, 1.0),  # just started: a whole interval
        (0.4, 0.6),  # the worker took 0.4 s to start the code: the rest of the interval
        (5.0, 0.0),  # a busy worker started it late: beat at once
        (-30.0, 1.0),  # worker clock behind the server's: never wait more than an interval
    ],
)
def test_the_first_beat_counts_from_the_server_start(started_ago: float, expected: float) -> None:
    env, _ = environment(started_ago=started_ago)
    delay = env.run(first_beat_delay, 1.0)
    assert delay == pytest.approx(expected, abs=0.05)


async def test_cancelling_the_activity_cancels_the_work_and_lets_it_unwind() -> None:
    env, beats = environment(started_ago=0.0, timeout=0.6)  # interval: 0.2 s
    events: list[str] = []

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # cleanup that itself waits (an MCP cancel, say)
            events.append("unwound")
            raise
        return "never"

    async def step() -> str:
        try:
            return await heartbeating(work(), "working")
        finally:
            events.append("returned")

    async def cancel_soon() -> None:
        await asyncio.sleep(0.5)
        env.cancel()

    canceller = asyncio.ensure_future(cancel_soon())
    with pytest.raises(asyncio.CancelledError):
        await env.run(step)
    await canceller
    assert events == ["unwound", "returned"]
    assert beats and beats[0] == ("working",)  # it beat while waiting
    # And no beat after the step ended.
    count = len(beats)
    await asyncio.sleep(0.5)
    assert len(beats) == count
