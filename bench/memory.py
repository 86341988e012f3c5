"""Worker memory per in-flight turn: the resident memory (RSS) of a worker process before and
with ``count`` turns waiting on a slow model, against the floor — a bare worker process with as
many bare workflows waiting on a slow activity.

The turn worker (``python -m bench.memory_worker turn``) is built as ``turnkeep worker`` builds
one, for an agent whose model is the fake Anthropic API on loopback
(``turnkeep.testing.FakeModelApi``), holding every answer. Both workers get ``count`` + 10
activity slots and cached workflows, so every turn really has its model call open (the SDK's
default is 100 activities at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.environment import Environment
from bench.floor import WAIT, FloorInput
from bench.report import Table, progress, ratio
from bench.turns import run_floor, until_true
from turnkeep.client.turns import start_turn
from turnkeep.contract.turn_io import TurnInput
from turnkeep.testing.fake_api import FakeModelApi

REPO = Path(__file__).resolve().parents[1]
SLOW = "slow"
WARM = "warm"


@dataclass(frozen=True)
class Footprint:
    before_bytes: int
    with_bytes: int
    count: int

    @property
    def per_workflow(self) -> float:
        return (self.with_bytes - self.before_bytes) / self.count


@dataclass(frozen=True)
class Memory:
    turn: Footprint
    floor: Footprint

    @property
    def ratio(self) -> float:
        return self.turn.per_workflow / self.floor.per_workflow


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _config(env: Environment, fake: FakeModelApi, directory: Path) -> Path:
    never_time_out = {"start_to_close": 3600, "heartbeat": 60}
    config: dict[str, Any] = {
        "payload_storage": {"path": str(env.payloads)},  # the bench client's storage
        "anthropic": {"api_key": "sk-bench", "base_url": fake.base_url_anthropic},
        "agents": {
            SLOW: {"model": "anthropic.bench", "llm_timeouts": never_time_out},
            WARM: {"model": "passthrough"},
        },
    }
    path = directory / "turnkeep.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    return path


@contextlib.contextmanager
def _process(
    kind: str, env: Environment, queue: str, slots: int, directory: Path, config: Path | None
) -> Iterator[tuple[int, Path]]:
    status = directory / f"{kind}-status.json"
    argv = [sys.executable, "-m", "bench.memory_worker", kind, "--address", env.info.address]
    argv += ["--namespace", env.info.namespace, "--queue", queue, "--slots", str(slots)]
    argv += ["--status", str(status)]
    if config is not None:
        argv += ["--config", str(config)]
    with (directory / f"{kind}.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield proc.pid, status
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


Starter = Callable[[], Awaitable[Any]]


async def _gathered(calls: list[Starter], at_once: int = 50) -> list[Any]:
    gate = asyncio.Semaphore(at_once)

    async def one(call: Starter) -> Any:
        async with gate:
            return await call()

    return await asyncio.gather(*(one(c) for c in calls))


async def _settled_rss(pid: int, seconds: float = 3.0) -> int:
    """The most resident memory seen over ``seconds`` (it still moves right after a burst)."""
    deadline = time.monotonic() + seconds
    highest = rss_bytes(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        highest = max(highest, rss_bytes(pid))
    return highest


def _starts(kind: str, env: Environment, queue: str, ids: list[str]) -> list[Starter]:
    if kind == "turn":
        turn = TurnInput(agent=SLOW, messages=["hi"])
        return [
            partial(start_turn, env.client, turn, workflow_id=wid, task_queue=queue) for wid in ids
        ]
    spec = FloorInput(1, WAIT)
    return [
        partial(env.plain.start_workflow, "Floor", spec, id=wid, task_queue=queue) for wid in ids
    ]


async def _warm_up(kind: str, env: Environment, queue: str) -> None:
    """Imports, a first sandbox, the SDK clients: what a worker has once it has done anything."""
    if kind == "turn":
        turn = TurnInput(agent=WARM, messages=["hi"])
        await (await start_turn(env.client, turn, task_queue=queue)).result()
    else:
        await run_floor(env.plain, queue, FloorInput(1))


async def _footprint(
    env: Environment,
    kind: str,
    count: int,
    directory: Path,
    fake: FakeModelApi,
    config: Path | None,
) -> Footprint:
    queue = f"bench-memory-{kind}-{uuid.uuid4().hex[:6]}"
    with _process(kind, env, queue, count + 10, directory, config) as (pid, status):
        await until_true(status.exists, f"the {kind} worker to start", within=120)
        await _warm_up(kind, env, queue)
        before = await _settled_rss(pid, 1.0)
        asked = len(fake.requests_for("anthropic"))

        def in_flight() -> bool:
            if kind == "turn":  # every turn's model request has reached the fake API
                return len(fake.requests_for("anthropic")) - asked >= count
            try:  # every floor's `wait` activity has started
                return int(json.loads(status.read_text())["waiting"]) >= count
            except (OSError, ValueError):
                return False

        progress(f"worker memory: starting {count} {kind} workflows")
        ids = [f"{queue}-{i}" for i in range(count)]
        await _gathered(_starts(kind, env, queue, ids))
        await until_true(in_flight, f"{count} {kind} workflows in flight", within=600)
        with_ = await _settled_rss(pid)
        progress(f"worker memory: {count} {kind} workflows in flight; terminating them")
        client = env.client if kind == "turn" else env.plain
        await _gathered([client.get_workflow_handle(wid).terminate for wid in ids])
    return Footprint(before, with_, count)


async def worker_memory(env: Environment, fake: FakeModelApi, count: int) -> tuple[Table, Memory]:
    directory = env.tmp / "memory"
    directory.mkdir(exist_ok=True)
    config = _config(env, fake, directory)
    turn = await _footprint(env, "turn", count, directory, fake, config)
    floor = await _footprint(env, "floor", count, directory, fake, None)
    result = Memory(turn, floor)
    table = Table(
        f"Worker memory: {count:,} workflows in flight on one worker process",
        ["worker", "RSS idle (MB)", f"RSS with {count:,} (MB)", "per workflow (KB)", "÷ floor"],
    )
    for name, f in (
        ("turnkeep: turns waiting on a slow model", turn),
        ("floor: bare workflows waiting on a slow activity", floor),
    ):
        table.add(
            name,
            f"{f.before_bytes / 2**20:.0f}",
            f"{f.with_bytes / 2**20:.0f}",
            f"{f.per_workflow / 1024:.0f}",
            ratio(f.per_workflow, floor.per_workflow) if f is turn else "",
        )
    table.notes.append(
        "RSS of the worker process (/proc/PID/status VmRSS), idle after one warm-up workflow, "
        "then with every workflow's activity started (the highest over 3 s). Each turn has its "
        "HTTP request to the model open."
    )
    return table, result
