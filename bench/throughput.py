"""Throughput: ``TURNS`` concurrent turns of ``ITERATIONS`` iterations (instant model, tool
results of 5 KB) on one worker, against the floor: as many bare workflows, each awaiting as many
no-op activities as one turn runs, on one worker with the same (default) options."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType

from bench.environment import FLOOR, TURNS, Environment
from bench.floor import FloorInput
from bench.report import Table, progress
from bench.turns import Agent, count, run_floor, run_turn, runs_of

CONCURRENT = 100
ITERATIONS = 5
TARGET = 0.8  # turns per second ≥ this × the floor's workflows per second


@dataclass(frozen=True)
class Throughput:
    turns: list[float]  # turns per second, one per round
    floors: list[float]  # floor workflows per second, same rounds
    activities: int

    @property
    def turns_per_second(self) -> float:
        return statistics.median(self.turns)

    @property
    def floors_per_second(self) -> float:
        return statistics.median(self.floors)

    @property
    def ratio(self) -> float:
        # Within a round, against that round's floor, then the median over rounds: load that
        # comes and goes hits both sides of each pair alike (as in ``bench.overhead``).
        return statistics.median(self.ratios)

    @property
    def ratios(self) -> list[float]:
        return [t / f for t, f in zip(self.turns, self.floors, strict=True)]


async def _batch(env: Environment, floor: bool, activities: int) -> float:
    """Workflows per second for ``CONCURRENT`` started at once, until the last one is done."""
    started = time.perf_counter()
    if floor:
        spec = FloorInput(activities)
        await asyncio.gather(*(run_floor(env.plain, FLOOR, spec) for _ in range(CONCURRENT)))
    else:
        agent = Agent(ITERATIONS)
        await asyncio.gather(*(run_turn(env.client, TURNS, agent) for _ in range(CONCURRENT)))
    return CONCURRENT / (time.perf_counter() - started)


async def throughput(env: Environment, repeats: int) -> tuple[Table, Throughput]:
    one = await run_turn(env.client, TURNS, Agent(ITERATIONS))
    events = [e for run in await runs_of(env.client, one.workflow_id) for e in run]
    activities = count(events, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    turns, floors = [], []
    for i in range(repeats):
        progress(f"throughput: round {i + 1} of {repeats}")
        # Which side goes first alternates: what one batch leaves the server to do after its
        # last result (visibility writes, timers) falls on the next batch, on each side alike.
        for floor in (False, True) if i % 2 == 0 else (True, False):
            batch = await _batch(env, floor=floor, activities=activities)
            (floors if floor else turns).append(batch)
    result = Throughput(turns, floors, activities)
    table = Table(
        f"Throughput: {CONCURRENT} concurrent {ITERATIONS}-iteration turns on one worker",
        ["", "per second", "÷ floor"],
    )
    table.add(
        "turns",
        f"{result.turns_per_second:.1f}",
        f"{result.ratio:.2f}×",
    )
    table.add(
        f"floor workflows ({activities} no-op activities each)",
        f"{result.floors_per_second:.1f}",
        "",
    )
    table.notes.append(
        f"Medians of {repeats} batches each, in rounds of one turn batch and one floor batch "
        "(which goes first alternates); ÷ floor is the median of each round's ratio. A batch "
        f"is timed from starting all {CONCURRENT} to the last result. "
        "Worker options are the SDK's defaults for both."
    )
    return table, result
