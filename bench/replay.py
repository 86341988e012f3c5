"""Counterfactual replay: what a replay of a 50-iteration turn costs beside the turn itself.

The source is the benchmark turn (``bench.turns``): the instant ``playback`` model calling the
5 KB ``blob`` tool ``ITERATIONS`` times, then answering. Its replay runs the same script, so
every call matches a recorded one: the replay makes the model calls and no tool call (no
``call_tool`` activity), once it has read the source's record (``replay_source``). Source
turns and replays alternate, so load that comes and goes hits both alike; the ratio is taken
per pair, then the median.
"""

from __future__ import annotations

import statistics
import time

from temporalio.api.enums.v1 import EventType

from bench.environment import TURNS, Environment
from bench.report import Table, median_interval, ms, progress
from bench.turns import Agent, run_turn, runs_of
from turnkeep.client.replays import replay_turn
from turnkeep.contract.activity_io import CALL_TOOL, LLM_STEP

ITERATIONS = 50
AGENT = Agent(ITERATIONS)


async def replays(env: Environment, pairs: int) -> Table:
    sources: list[float] = []
    replayed: list[float] = []
    last_source = last_replay = ""
    for i in range(pairs):
        progress(f"replay: pair {i + 1}/{pairs}")
        turn = await run_turn(env.client, TURNS, AGENT)
        started = time.perf_counter()
        handle = await replay_turn(env.client, turn.workflow_id, task_queue=TURNS)
        result = await handle.result()
        replayed.append(time.perf_counter() - started)
        sources.append(turn.seconds)
        assert result.iterations == turn.result.iterations, "the replay took another path"
        last_source, last_replay = turn.workflow_id, handle.workflow_id
    counts = {
        name: [await _activities(env, workflow_id, name) for name in (LLM_STEP, CALL_TOOL)]
        for name, workflow_id in (("source", last_source), ("replay", last_replay))
    }
    ratios = [r / s for r, s in zip(replayed, sources, strict=True)]
    low, high = median_interval(ratios)
    table = Table(
        f"Counterfactual replay of a {ITERATIONS}-iteration turn ({pairs} pairs)",
        ["turn", "median ms", "model calls", "tool activities", "× source"],
    )
    table.add("source turn", ms(statistics.median(sources)), *counts["source"], "1.00×")
    table.add(
        "its replay (recorded results)",
        ms(statistics.median(replayed)),
        *counts["replay"],
        f"{statistics.median(ratios):.2f}× ({low:.2f}–{high:.2f}×)",
    )
    table.notes.append(
        "Instant playback model, 5 KB tool results; the replay's time runs from its start "
        "request (reading the source's record included) to its result."
    )
    return table


async def _activities(env: Environment, workflow_id: str, name: str) -> int:
    return sum(
        1
        for events in await runs_of(env.client, workflow_id)
        for event in events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == name
    )
