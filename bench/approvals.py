"""Turns waiting for a person's approval (issue #23): ``count`` turns each stopped on a tool call
awaiting approval at once on one worker process (``bench.waiting_worker``), then a sample of
them decided one at a time while the others keep waiting, then a query to each of the others.

Reported: the worker's activity slots in use while they all wait (the Core SDK's own gauge; and
the server's pending activities of a sample of the turns), the workflows its cache holds, the
worker's resident memory (RSS) per waiting turn, measured as ``bench.memory`` measures it,
the same after the queries, and the latency of a decision: from calling ``decide`` to the
update's answer, and to the turn's result (the approved tool has run, its result is recorded,
and the model has answered after it). A turn waiting only for people leaves the worker's cache
(``turnkeep.workflows.worker_cache``): its decision replays it from history, and so does a
query, after which it leaves again.

The turn is the ``playback`` model asking for one instant function tool (``local__line``) that
the agent's ``approval.tools`` gates, then answering. The worker caches up to ``count`` + 10
workflows, so none leaves its cache to make room: what leaves, leaves because it waits for
people. Its activity slots stay at the SDK's default (100), fewer than the turns waiting.

Where a waiting turn's memory goes: run with ``TURNKEEP_BENCH_TRACEMALLOC=DIR`` (and
``TURNKEEP_BENCH_TRACE_FRAMES=0`` for the worker's own RSS, or a few dozen turns with tracing)
and the worker's heap figures, live objects by type and traced Python allocations, before
and with every turn waiting, are printed per turn (``bench.waiting_worker``).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.environment import Environment
from bench.memory import _gathered, _settled_rss
from bench.report import Table, Target, progress
from bench.turns import SERVER, until, until_true
from bench.waiting_worker import TRACEMALLOC, WorkerProcess, diff, heap_path, worker_process
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.contract.turn_io import TurnInput

AGENT = "gated"
CALL = "c0"
TOOL = f"{SERVER}__line"
RSS_TARGET_KB = 100
LATENCY_TARGET_S = 1.0
SLOTS_TARGET = "a turn awaiting approval holds no worker slot"
RSS_TARGET = f"worker memory ≤ {RSS_TARGET_KB} KB per turn awaiting approval"
LATENCY_TARGET = f"a decision resumes its turn within {LATENCY_TARGET_S:g} s (median)"
TARGETS = [SLOTS_TARGET, RSS_TARGET, LATENCY_TARGET]


@dataclass(frozen=True)
class Decisions:
    """Decisions made one at a time: seconds from ``decide`` to its update's answer, and to the
    turn's result."""

    answered: list[float]
    completed: list[float]


@dataclass(frozen=True)
class Approvals:
    count: int
    activity_slots_used: float
    cached_workflows: float | None  # while they all wait
    pending_activities: int  # over `described` waiting turns, as the server has them
    described: int
    before_bytes: int
    with_bytes: int  # every turn waiting
    queried: int  # turns asked which calls wait, after the decisions
    queried_bytes: int  # once they had answered
    cached_queried: float | None  # workflows in the worker's cache then
    decisions: Decisions

    @property
    def per_turn(self) -> float:
        return (self.with_bytes - self.before_bytes) / self.count

    @property
    def per_queried_turn(self) -> float:
        return (self.queried_bytes - self.with_bytes) / self.queried


def config(directory: Path, payloads: Path) -> Path:
    """A turnkeep.yaml with the gated agent; payloads in the bench client's storage."""
    script = directory / f"{AGENT}.json"
    call = {"tool_calls": {CALL: {"name": TOOL, "arguments": {"i": 0}}}}
    script.write_text(json.dumps([call, "done"]), encoding="utf-8")
    agent = {
        "model": "playback",
        "playback": str(script),
        "servers": [SERVER],
        "max_iterations": 2,
        "approval": {"tools": [TOOL], "timeout": "1d"},
    }
    settings: dict[str, Any] = {
        "base_dir": str(directory),
        "payload_storage": {"path": str(payloads)},
        "agents": {AGENT: agent},
    }
    path = directory / "turnkeep.yaml"
    path.write_text(json.dumps(settings), encoding="utf-8")  # JSON is YAML
    return path


async def _awaiting(turn: TurnHandle) -> None:
    async def check() -> bool | None:
        return True if await turn.pending_approvals() else None

    await until(check, f"{turn.workflow_id} to await approval", within=300)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


async def measure(env: Environment, count: int, sample: int) -> Approvals:
    directory = env.tmp / "approvals"
    directory.mkdir(exist_ok=True)
    queue = f"bench-approvals-{uuid.uuid4().hex[:6]}"
    path = config(directory, env.payloads)
    info = env.info
    with worker_process(info.address, info.namespace, queue, path, count + 10, directory) as w:
        await until_true(lambda: w.report() is not None, "the approval worker to start", 120)
        # What a worker has once it has done this before: imports, the sandbox, one decision.
        for _ in range(2):
            turn = await _start(env, queue, f"{queue}-warm-{uuid.uuid4().hex[:6]}")
            await _awaiting(turn)
            await turn.decide(CALL, True, by="bench")
            await turn.result()
        before = await _settled_rss(w.pid, 1.0)
        await _snapshot(w, 0)
        progress(f"approvals: starting {count} turns that stop on a call awaiting approval")
        ids = [f"{queue}-{i}" for i in range(count)]
        turns: list[TurnHandle] = await _gathered([partial(_start, env, queue, i) for i in ids])
        await _all_awaiting(env, queue, count)
        with_ = await _settled_rss(w.pid)
        if await _snapshot(w, 1):
            progress(f"approvals: what grew with {count} waiting turns\n" + _diff(count))
        slots, cached = await _slots(w)
        described = turns[:: max(1, count // 20)]
        pending = 0
        for turn in described:
            pending += len((await turn.handle.describe()).raw_description.pending_activities)
        progress(f"approvals: {count} turns await approval; deciding {sample} one at a time")
        decisions = await _decide(turns[:sample])
        rest = turns[sample:]
        progress(f"approvals: a query to each of the {len(rest)} others")
        await _gathered([t.pending_approvals for t in rest])
        queried = await _settled_rss(w.pid)
        cached_queried = w.cached_workflows()
        progress(f"approvals: terminating the other {len(rest)} turns")
        await _gathered([t.handle.terminate for t in rest])
    return Approvals(
        count,
        slots,
        cached,
        pending,
        len(described),
        before,
        with_,
        len(rest),
        queried,
        cached_queried,
        decisions,
    )


async def _decide(turns: list[TurnHandle]) -> Decisions:
    """Approve each turn's call, one turn at a time, and time it."""
    answered, completed = [], []
    for turn in turns:
        started = time.perf_counter()
        await turn.decide(CALL, True, by="bench")
        answered.append(time.perf_counter() - started)
        await turn.result()
        completed.append(time.perf_counter() - started)
    return Decisions(answered, completed)


async def _snapshot(w: WorkerProcess, n: int) -> bool:
    """With ``TURNKEEP_BENCH_TRACEMALLOC`` set, the worker's ``n``-th heap snapshot
    (``bench.waiting_worker``), once written; without, nothing (False)."""
    directory = os.environ.get(TRACEMALLOC)
    if not directory:
        return False
    os.kill(w.pid, signal.SIGUSR1)
    path = heap_path(Path(directory), n)
    await until_true(path.exists, f"heap snapshot {n}", 600)
    return True


def _diff(count: int) -> str:
    return diff(Path(os.environ[TRACEMALLOC]), 0, 1, count)


async def _start(env: Environment, queue: str, workflow_id: str) -> TurnHandle:
    turn = TurnInput(agent=AGENT, messages=["write it"])
    return await start_turn(env.client, turn, workflow_id=workflow_id, task_queue=queue)


async def _all_awaiting(env: Environment, queue: str, count: int) -> None:
    """Every turn on ``queue`` is AwaitingApproval, by the one query an operator would run."""
    query = f'TaskQueue = "{queue}" AND TurnkeepStatus = "AwaitingApproval"'

    async def check() -> bool | None:
        return True if (await env.client.count_workflows(query)).count >= count else None

    await until(check, f"{count} turns awaiting approval", within=600)


async def _slots(w: WorkerProcess) -> tuple[float, float | None]:
    """The worker's activity slots in use and its cached workflows, once it has reported its
    gauges (they appear with the first activity it ran)."""

    async def check() -> float | None:
        return w.slots_used()

    slots = await until(check, "the worker's slot gauge", within=30)
    return slots, w.cached_workflows()


def table(a: Approvals) -> tuple[Table, list[Target]]:
    out = Table(
        f"Approvals: {a.count:,} turns awaiting approval at once on one worker process",
        ["what", "measured"],
    )
    out.add("activity slots in use while they wait (worker's gauge)", f"{a.activity_slots_used:g}")
    out.add(
        "pending activities (server, sample of waiting turns)",
        f"{a.pending_activities} over {a.described} turns",
    )
    if a.cached_workflows is not None:
        out.add("workflows in the worker's cache while they wait", f"{a.cached_workflows:,.0f}")
    out.add("worker RSS idle / with them all waiting (MB)", _mb(a.before_bytes, a.with_bytes))
    out.add("worker RSS per waiting turn (KB)", f"{a.per_turn / 1024:.0f}")
    if a.queried:  # none are left to query when the sample decided every turn
        queried = f"… after a query to each of {a.queried:,} of them"
        if a.cached_queried is not None:
            out.add(f"{queried}: workflows in the worker's cache", f"{a.cached_queried:,.0f}")
        out.add(
            f"{queried}: worker RSS (MB) / per turn queried (KB)",
            f"{a.queried_bytes / 2**20:.0f} / {a.per_queried_turn / 1024:.0f}",
        )
    d = a.decisions
    n = len(d.completed)
    out.add(f"decide → update answered, median / p95 of {n} (ms)", _ms(d.answered))
    out.add(f"decide → turn completed, median / p95 of {n} (ms)", _ms(d.completed))
    out.notes.append(
        "RSS of the worker process (/proc/PID/status VmRSS) after two decided warm-up turns, "
        "then with every turn awaiting approval (the highest over 3 s): a turn waiting only "
        "for people leaves the worker's cache, and its decision replays it from history; so "
        "does a query, after which the turn leaves again. Decisions are made one at a time "
        "while the other turns keep waiting; *turn completed*: the approved tool ran and the "
        "model answered after its result."
    )
    median = statistics.median(d.completed)
    targets = [
        Target(
            SLOTS_TARGET,
            f"{a.activity_slots_used:g} activity slots in use with {a.count:,} waiting",
            a.activity_slots_used == 0 and a.pending_activities == 0,
        ),
        Target(RSS_TARGET, f"{a.per_turn / 1024:.0f} KB", a.per_turn <= RSS_TARGET_KB * 1024),
        Target(
            LATENCY_TARGET,
            f"{median * 1000:.0f} ms to the turn's result (p95 "
            f"{percentile(d.completed, 0.95) * 1000:.0f} ms, {n} decisions)",
            median <= LATENCY_TARGET_S,
        ),
    ]
    return out, targets


def _mb(before: int, with_: int) -> str:
    return f"{before / 2**20:.0f} / {with_ / 2**20:.0f}"


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} / {percentile(values, 0.95) * 1000:.0f}"


async def approvals(env: Environment, count: int, sample: int) -> tuple[Table, list[Target]]:
    return table(await measure(env, count, sample))
