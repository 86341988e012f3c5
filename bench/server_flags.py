"""Do the embedded dev server's flags (``turnkeep.devserver.embedded``) pay for themselves?

``EmbeddedServer`` and turnkeep's background server pass ``FAST_DYNAMIC_CONFIG`` (history
task-queue polling at 1000 RPS instead of 20, timers fired at most 10 ms late instead of up to
1 s) and, with a database file, ``FAST_SQLITE_PRAGMAS`` (WAL, synchronous=NORMAL). Each claim
is checked by starting a dev server per configuration — with no flags, with all of them, and
with all but one — and timing, on each, a sequential activity step (``Floor`` with no-op
activities) and a short timer (``TimerFloor``), bare Temporal with no turnkeep code.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from bench.floor import ACTIVITIES, Floor, FloorInput, TimerFloor
from bench.report import Table, progress
from bench.turns import run_floor
from turnkeep.devserver.embedded import FAST_DYNAMIC_CONFIG, FAST_SQLITE_PRAGMAS, EmbeddedServer

STEPS = 30
TIMERS = 5
TIMER_SECONDS = 0.05
QUEUE = "flags"


@dataclass(frozen=True)
class ServerConfig:
    label: str
    sqlite: bool
    dynamic: tuple[str, ...] = ()
    pragmas: bool = False


def _flag_name(value: str) -> str:
    return value.split("=")[0].removeprefix("history.")


def configs(quick: bool) -> list[ServerConfig]:
    everything = ServerConfig("SQLite file, turnkeep's flags", True, FAST_DYNAMIC_CONFIG, True)
    chosen = [
        ServerConfig("SQLite file, default flags", True),
        everything,
        ServerConfig("in memory, default flags", False),
        ServerConfig("in memory, turnkeep's flags", False, FAST_DYNAMIC_CONFIG),
    ]
    if quick:
        return chosen
    # Leave each flag out in turn: what it is worth with the others in place.
    for value in FAST_DYNAMIC_CONFIG:
        rest = tuple(v for v in FAST_DYNAMIC_CONFIG if v != value)
        chosen.append(ServerConfig(f"SQLite file, all but {_flag_name(value)}", True, rest, True))
    chosen.append(ServerConfig("SQLite file, all but the pragmas", True, FAST_DYNAMIC_CONFIG))
    return chosen


class ConfiguredServer(EmbeddedServer):
    """A dev server with exactly ``config``'s flags."""

    def __init__(self, config: ServerConfig, directory: Path) -> None:
        db_file = directory / f"{uuid.uuid4().hex[:8]}.db" if config.sqlite else None
        super().__init__(db_file=db_file, ui=False, fast=False)
        self.config = config

    def argv(self) -> list[str]:
        argv = super().argv()
        for value in self.config.dynamic:
            argv += ["--dynamic-config-value", value]
        if self.db_file is not None and self.config.pragmas:
            for pragma in FAST_SQLITE_PRAGMAS:
                argv += ["--sqlite-pragma", pragma]
        return argv


@dataclass(frozen=True)
class FlagTimes:
    config: ServerConfig
    step_seconds: float  # one sequential activity step
    timer_seconds: float  # one TIMER_SECONDS timer, start to the workflow going on


async def _timers(client: Client) -> float:
    started = time.perf_counter()
    await client.execute_workflow(
        TimerFloor.run,
        args=[TIMERS, TIMER_SECONDS],
        id=f"timers-{uuid.uuid4().hex[:8]}",
        task_queue=QUEUE,
    )
    return (time.perf_counter() - started) / TIMERS


async def measure(config: ServerConfig, directory: Path, repeats: int) -> FlagTimes:
    async with ConfiguredServer(config, directory) as info:
        client = await Client.connect(info.address)
        async with Worker(
            client, task_queue=QUEUE, workflows=[Floor, TimerFloor], activities=ACTIVITIES
        ):
            await run_floor(client, QUEUE, FloorInput(5))  # warm-up
            steps, timers = [], []
            for _ in range(repeats):
                steps.append((await run_floor(client, QUEUE, FloorInput(STEPS)))[0] / STEPS)
                timers.append(await _timers(client))
    return FlagTimes(config, statistics.median(steps), statistics.median(timers))


async def server_flags(quick: bool) -> tuple[Table, list[FlagTimes]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="turnkeep-bench-flags-") as name:
        for config in configs(quick):
            progress(f"server flags: {config.label}")
            results.append(await measure(config, Path(name), repeats=2 if quick else 3))
    baseline = {r.config.sqlite: r for r in results if not r.config.dynamic}
    table = Table(
        "Dev-server flags: one sequential activity step and one 50 ms timer, bare Temporal",
        ["server", "activity step (ms)", "vs default flags", "50 ms timer takes (ms)"],
    )
    for r in results:
        base = baseline[r.config.sqlite]
        table.add(
            r.config.label,
            f"{r.step_seconds * 1000:.1f}",
            f"{r.step_seconds / base.step_seconds:.2f}×",
            f"{r.timer_seconds * 1000:.0f}",
        )
    table.notes.append(
        f"Median of runs of {STEPS} no-op activities and of {TIMERS} timers, one dev server per "
        "line. turnkeep's flags: " + ", ".join(FAST_DYNAMIC_CONFIG) + "; with a file also "
        "--sqlite-pragma " + ", ".join(FAST_SQLITE_PRAGMAS) + ". `EmbeddedServer()` (tests, "
        "benchmarks) is *in memory, turnkeep's flags*; `turnkeep server`/`run` use a file."
    )
    return table, results
