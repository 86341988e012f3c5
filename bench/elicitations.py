"""Turns waiting on an MCP server's elicitation (issue #35): ``count`` turns each stopped on a
tool call whose server asked the user something, all at once on one worker process
(``bench.waiting_worker``), then a sample of them answered one at a time while the others keep
waiting.

The tool is ``book`` of the test suite's asking server (``tests/mcp_servers/asking_server.py``,
stdio, one process for the worker), which asks for a name and a number of seats and books them
once answered; the agent is the ``playback`` model calling it once, then answering. The call
suspends ("needs input"): its activity ends, and the turn waits as an approval does (no
activity, out of the worker's cache). Reported as ``bench.approvals`` reports approvals: the
worker's activity slots in use, its resident memory per waiting turn, and the latency of an
answer, from ``answer_elicitation`` to the update's answer, and to the turn's result (the tool
ran again with the answer, and the model answered after its result).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.approvals import _diff, _mb, _ms, _slots, _snapshot, percentile
from bench.environment import Environment
from bench.memory import _gathered, _settled_rss
from bench.report import Table, Target, progress
from bench.turns import until, until_true
from bench.waiting_worker import REPO, worker_process
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.contract.turn_io import TurnInput

AGENT = "booking"
TOOL = "shows__book"
SERVER_SCRIPT = REPO / "tests" / "mcp_servers" / "asking_server.py"
RSS_TARGET_KB = 30
LATENCY_TARGET_S = 1.0
RSS_TARGET = f"worker memory ≤ {RSS_TARGET_KB} KB per turn awaiting an elicitation"
LATENCY_TARGET = f"an answer resumes the tool within {LATENCY_TARGET_S:g} s (median)"
TARGETS = [RSS_TARGET, LATENCY_TARGET]
ANSWER = {"name": "bench", "seats": 2}


@dataclass(frozen=True)
class Elicitations:
    count: int
    activity_slots_used: float
    cached_workflows: float | None
    before_bytes: int
    with_bytes: int
    answered: list[float]  # answer_elicitation → the update's answer
    completed: list[float]  # … → the turn's result

    @property
    def per_turn(self) -> float:
        return (self.with_bytes - self.before_bytes) / self.count


def config(directory: Path, payloads: Path) -> Path:
    script = directory / f"{AGENT}.json"
    call = {"tool_calls": {"c0": {"name": TOOL, "arguments": {"show": "bench"}}}}
    script.write_text(json.dumps([call, "done"]), encoding="utf-8")
    agent = {
        "model": "playback",
        "playback": str(script),
        "servers": ["shows"],
        "max_iterations": 2,
    }
    server = {
        "command": sys.executable,
        "args": [str(SERVER_SCRIPT)],
        "elicitation": {"mode": "forms", "timeout": 86400},
    }
    settings: dict[str, Any] = {
        "base_dir": str(directory),
        "payload_storage": {"path": str(payloads)},
        "mcp": {"servers": {"shows": server}},
        "agents": {AGENT: agent},
    }
    path = directory / "turnkeep.yaml"
    path.write_text(json.dumps(settings), encoding="utf-8")  # JSON is YAML
    return path


async def _waiting_id(turn: TurnHandle) -> str:
    async def check() -> str | None:
        pending = await turn.pending_approvals()
        return pending[0].call_id if pending else None

    return await until(check, f"{turn.workflow_id} to await an elicitation", within=300)


async def _start(env: Environment, queue: str, workflow_id: str) -> TurnHandle:
    turn = TurnInput(agent=AGENT, messages=["book it"])
    return await start_turn(env.client, turn, workflow_id=workflow_id, task_queue=queue)


async def _all_waiting(env: Environment, queue: str, count: int) -> None:
    query = f'TaskQueue = "{queue}" AND TurnkeepStatus = "AwaitingApproval"'

    async def check() -> bool | None:
        return True if (await env.client.count_workflows(query)).count >= count else None

    await until(check, f"{count} turns awaiting an elicitation", within=600)


async def _answer(turn: TurnHandle, id: str) -> tuple[float, float]:
    started = time.perf_counter()
    await turn.answer_elicitation(id, ANSWER, by="bench")
    answered = time.perf_counter() - started
    await turn.result()
    return answered, time.perf_counter() - started


async def measure(env: Environment, count: int, sample: int) -> Elicitations:
    directory = env.tmp / "elicitations"
    directory.mkdir(exist_ok=True)
    queue = f"bench-elicit-{uuid.uuid4().hex[:6]}"
    path = config(directory, env.payloads)
    info = env.info
    with worker_process(info.address, info.namespace, queue, path, count + 10, directory) as w:
        await until_true(lambda: w.report() is not None, "the elicitation worker to start", 120)
        for _ in range(2):  # imports, the sandbox, the server's process, one answer
            turn = await _start(env, queue, f"{queue}-warm-{uuid.uuid4().hex[:6]}")
            await _answer(turn, await _waiting_id(turn))
        before = await _settled_rss(w.pid, 1.0)
        await _snapshot(w, 0)
        progress(f"elicitations: starting {count} turns that stop on an elicitation")
        ids = [f"{queue}-{i}" for i in range(count)]
        turns: list[TurnHandle] = await _gathered([partial(_start, env, queue, i) for i in ids])
        await _all_waiting(env, queue, count)
        with_ = await _settled_rss(w.pid)
        if await _snapshot(w, 1):
            progress(f"elicitations: what grew with {count} waiting turns\n" + _diff(count))
        slots, cached = await _slots(w)
        progress(f"elicitations: {count} turns wait; answering {sample} one at a time")
        answered, completed = [], []
        for turn in turns[:sample]:
            a, c = await _answer(turn, await _waiting_id(turn))
            answered.append(a)
            completed.append(c)
        progress(f"elicitations: terminating the other {count - sample} turns")
        await _gathered([t.handle.terminate for t in turns[sample:]])
    return Elicitations(count, slots, cached, before, with_, answered, completed)


def table(e: Elicitations) -> tuple[Table, list[Target]]:
    out = Table(
        f"Elicitations: {e.count:,} turns awaiting an MCP elicitation at once on one worker",
        ["what", "measured"],
    )
    out.add("activity slots in use while they wait (worker's gauge)", f"{e.activity_slots_used:g}")
    if e.cached_workflows is not None:
        out.add("workflows in the worker's cache while they wait", f"{e.cached_workflows:,.0f}")
    out.add("worker RSS idle / with them all waiting (MB)", _mb(e.before_bytes, e.with_bytes))
    out.add("worker RSS per waiting turn (KB)", f"{e.per_turn / 1024:.0f}")
    n = len(e.completed)
    out.add(f"answer → update answered, median / p95 of {n} (ms)", _ms(e.answered))
    out.add(f"answer → turn completed, median / p95 of {n} (ms)", _ms(e.completed))
    out.notes.append(
        "Each turn's tool call ran once and suspended on the server's elicitation; the turn "
        "then waits with no activity running, out of the worker's cache. *turn completed*: the "
        "tool ran again, was answered from the recorded answer, and the model answered after "
        "its result."
    )
    median = statistics.median(e.completed)
    targets = [
        Target(RSS_TARGET, f"{e.per_turn / 1024:.0f} KB", e.per_turn <= RSS_TARGET_KB * 1024),
        Target(
            LATENCY_TARGET,
            f"{median * 1000:.0f} ms to the turn's result (p95 "
            f"{percentile(e.completed, 0.95) * 1000:.0f} ms, {n} answers)",
            median <= LATENCY_TARGET_S,
        ),
    ]
    return out, targets


async def elicitations(env: Environment, count: int, sample: int) -> tuple[Table, list[Target]]:
    return table(await measure(env, count, sample))
