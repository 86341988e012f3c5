"""The turn the benchmarks run, and how they read what it left behind.

A benchmark turn is the ``playback`` model scripted to call one instant function tool K times
and then answer: every iteration is one model call and one tool call that take no time of their
own, so what is measured is turnkeep and Temporal. The tool returns 5 KB (``blob``) or a short
line (``line``); ``blob_async`` is ``blob`` declared ``async``, which runs on the worker's event
loop instead of a thread.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.carry_floor import CarryFloor
from bench.floor import Floor, FloorInput
from turnkeep.client.turns import start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.turn_io import TurnInput, TurnResult

T = TypeVar("T")
RESULT_BYTES = 5 * 1024
SERVER = "local"  # the function-tool server the tools are served under


def blob(i: int) -> str:
    """Returns 5 KB of text."""
    return f"result {i}: " + "x" * RESULT_BYTES


async def blob_async(i: int) -> str:
    """Returns 5 KB of text."""
    return blob(i)


def line(i: int) -> str:
    """Returns one short line."""
    return f"result {i}: ok"


TOOLS = {SERVER: [blob, blob_async, line]}


@dataclass(frozen=True)
class Agent:
    """A scripted agent: ``iterations`` tool calls to ``tool``, then a final answer."""

    iterations: int
    tool: str = "blob"

    @property
    def name(self) -> str:
        return f"{self.tool}-{self.iterations}"


def settings(tmp: Path, agents: Iterable[Agent], **extra: Any) -> Settings:
    """Worker settings with one playback agent per ``Agent``; payloads stored under ``tmp``
    (never in the user's state directory)."""
    config: dict[str, Any] = {
        "base_dir": str(tmp),
        "payload_storage": {"path": str(tmp / "payloads")},
        "agents": {},
    }
    for agent in agents:
        script = tmp / f"{agent.name}.json"
        call = {"name": f"{SERVER}__{agent.tool}", "arguments": {"i": 0}}
        calls = [
            {"tool_calls": {f"c{i}": {**call, "arguments": {"i": i}}}}
            for i in range(agent.iterations)
        ]
        script.write_text(json.dumps([*calls, "done"]), encoding="utf-8")
        config["agents"][agent.name] = {
            "model": "playback",
            "playback": str(script),
            "servers": [SERVER],
            "max_iterations": agent.iterations + 1,
            # Raw growth is what is measured: no summaries replacing old exchanges.
            "compaction": {"enabled": False},
        }
    config.update(extra)
    return Settings.model_validate(config)


@dataclass(frozen=True)
class FinishedTurn:
    seconds: float
    workflow_id: str
    first_run_id: str
    result: TurnResult


async def run_turn(client: Client, queue: str, agent: Agent) -> FinishedTurn:
    """A turn from its start request to its decoded result, timed as ``run_floor`` times a
    floor (its start included)."""
    started = time.perf_counter()
    handle = await start_turn(
        client, TurnInput(agent=agent.name, messages=["go"]), task_queue=queue
    )
    result = await handle.result()
    seconds = time.perf_counter() - started
    run_id = handle.handle.first_execution_run_id or handle.handle.run_id or ""
    return FinishedTurn(seconds, handle.workflow_id, run_id, result)


async def run_floor(client: Client, queue: str, spec: FloorInput) -> tuple[float, str]:
    """Seconds a ``Floor`` took, and its workflow id."""
    workflow_id = f"floor-{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    await client.execute_workflow(Floor.run, spec, id=workflow_id, task_queue=queue)
    return time.perf_counter() - started, workflow_id


async def run_carry(client: Client, queue: str, iterations: int) -> float:
    """Seconds a ``CarryFloor`` of ``iterations`` took, started as ``start_turn`` starts a turn
    (eagerly, when a worker of ``client`` polls ``queue``) and timed as ``run_turn`` times one."""
    started = time.perf_counter()
    handle = await client.start_workflow(
        CarryFloor.run,
        iterations,
        id=f"carry-{uuid.uuid4().hex[:12]}",
        task_queue=queue,
        request_eager_start=True,
    )
    await handle.result()
    return time.perf_counter() - started


def conversation_bytes(result: TurnResult) -> int:
    """The conversation itself: the turn's history as JSON."""
    return len(json.dumps([m.model_dump(mode="json") for m in result.history]))


async def runs_of(
    client: Client, workflow_id: str, run_id: str | None = None
) -> list[list[HistoryEvent]]:
    """The events of every run of a workflow, first to last, following continue-as-new."""
    runs: list[list[HistoryEvent]] = []
    next_run: str | None = run_id
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=next_run).fetch_history()
        events = list(history.events)
        runs.append(events)
        last = events[-1] if events else None
        if (
            last is None
            or last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        ):
            return runs
        next_run = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id


def count(events: Iterable[HistoryEvent], kind: EventType.ValueType) -> int:
    return sum(1 for e in events if e.event_type == kind)


async def until(check: Callable[[], Awaitable[T | None]], what: str, within: float = 300.0) -> T:
    """Polls ``check`` until it returns something other than None."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:g} s")
        await asyncio.sleep(0.05)


async def until_true(predicate: Callable[[], bool], what: str, within: float = 300.0) -> None:
    async def check() -> bool | None:
        return True if predicate() else None

    await until(check, what, within)
