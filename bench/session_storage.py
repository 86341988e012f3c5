"""A session's storage against its conversation (issues #37 and #43): one session per kind of
turn, its history and stored bytes measured as it grows.

Each session answers ``turns`` messages one after another, as ``turnkeep chat`` does. *short*:
the ``playback`` model answers at once; *tools*: it first calls a function tool that returns
5 KB, then answers. At each checkpoint (after 50, 200 and 1,000 turns, those the session
reaches) it reports what follows. The ``storage`` section (``large``) does the same for
sessions whose messages are large, at 20 and 80 turns: user messages of 2 KB and of 20 KB
answered by the ``passthrough`` model (which echoes them), and 2 KB messages answered after a
tool that returns 200 KB; there, after every turn a reader also asks the session for its
whole transcript, as the gateway's ``GET /api/sessions/{id}`` does. Each checkpoint:

- the conversation: the JSON of every message the session holds (its transcript);
- history: every event of every run of the session so far, and of every child turn;
- stored: what payload storage gained since the session started.

Targets: history + stored ≤ 2× the conversation + 10 KB per turn, and the growth exponent
of history + stored between the first and the last checkpoint ≤ 1.1 (a session of twice the
turns costs at most 2.14× the bytes). Also the replay of the session's last complete run, out
of the workflow cache, per turn in it (the median of five replays): by a worker that has run
the session (its conversation cache holds the run's carried transcript), and by one that has
not (*cold*: that cache emptied before each replay), next to its floor: a bare workflow with
the same workflow tasks per turn (``bench.floor.SessionFloor``), replayed the same way.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from bench.environment import FLOOR_RUNNER, Environment, floor_worker
from bench.floor import SessionFloor, SessionFloorTurn
from bench.report import Table, Target, progress
from bench.turns import runs_of
from turnkeep.client.sessions import open_session
from turnkeep.config.settings import Settings
from turnkeep.worker.build import build_worker
from turnkeep.worker.replay import replay_plugin
from turnkeep.workflows.conversation_cache import conversations

CHECKPOINTS = (50, 200, 1000)
KINDS = ("short", "tools")
RESULT_BYTES = 5 * 1024
# Issue #43's: the kinds of session with large messages, and where they are measured.
LARGE_CHECKPOINTS = (20, 80)
LARGE_KINDS = ("2 KB messages", "20 KB messages", "200 KB tool results")
BIG_RESULT_BYTES = 200 * 1024
AGENT = "talk"
FACTOR = 2.0
PER_TURN_BYTES = 10 * 1024
EXPONENT_MAX = 1.1
REPLAY_MS_MAX = 5.0
REPLAYS = 5
SIZE_TARGET = f"history + stored ≤ {FACTOR:g}× the conversation + 10 KB per turn"
GROWTH_TARGET = f"growth of history + stored with the session's turns: exponent ≤ {EXPONENT_MAX}"
REPLAY_TARGET = f"replaying a session run out of cache ≤ {REPLAY_MS_MAX:g} ms per turn in it"
TARGETS = [SIZE_TARGET, GROWTH_TARGET, REPLAY_TARGET]


def five_kb() -> str:
    """Returns 5 KB of text."""
    return "x" * RESULT_BYTES


def two_hundred_kb() -> str:
    """Returns 200 KB of text."""
    return "r" * BIG_RESULT_BYTES


TOOLS = {"local": [five_kb, two_hundred_kb]}


def _message_bytes(kind: str) -> int:
    """How long each user message of a ``kind`` session is (0: a few words)."""
    return {"2 KB messages": 2048, "20 KB messages": 20480, "200 KB tool results": 2048}.get(
        kind, 0
    )


def _config(directory: Path, payloads: Path, kind: str) -> dict[str, Any]:
    script = directory / f"{kind.replace(' ', '-')}.json"
    tool = {"tools": "local__five_kb", "200 KB tool results": "local__two_hundred_kb"}.get(kind)
    if tool is not None:
        call = {"tool_calls": {"c1": {"name": tool, "arguments": {}}}}
        entries: list[Any] = [call, "done"]
        servers = ["local"]
    else:
        entries, servers = ["done"], []
    script.write_text(json.dumps(entries), encoding="utf-8")
    # No compaction: the playback model's "summary" is the whole transcript, which says
    # nothing of what a summary costs. Large messages are echoed (a plain model answering at
    # their length), tool results answered after with a word.
    model: dict[str, Any] = (
        {"model": "passthrough"}
        if kind in LARGE_KINDS and tool is None
        else {"model": "playback", "playback": str(script)}
    )
    agent = {**model, "servers": servers, "compaction": {"enabled": False}}
    return {
        "base_dir": str(directory),
        "payload_storage": {"path": str(payloads)},
        "agents": {AGENT: agent},
    }


@dataclass(frozen=True)
class Checkpoint:
    turns: int
    conversation: int
    history: int
    stored: int

    @property
    def total(self) -> int:
        return self.history + self.stored

    @property
    def allowed(self) -> float:
        return FACTOR * self.conversation + PER_TURN_BYTES * self.turns


@dataclass(frozen=True)
class Growth:
    kind: str
    checkpoints: list[Checkpoint]
    replay_ms_per_turn: float | None
    replayed_turns: int
    cold_replay_ms_per_turn: float | None = None

    @property
    def exponent(self) -> float | None:
        if len(self.checkpoints) < 2:
            return None
        a, b = self.checkpoints[0], self.checkpoints[-1]
        return math.log(b.total / a.total) / math.log(b.turns / a.turns)


def _bytes(events: list[Any]) -> int:
    return sum(e.ByteSize() for e in events)


def _stored(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


async def _history_bytes(
    client: Client, session_id: str, first_run: str, turns: int, known: dict[int, int]
) -> int:
    total = sum(_bytes(run) for run in await runs_of(client, session_id, first_run))
    for n in range(1, turns + 1):
        if n not in known:  # an ended turn's history no longer changes
            known[n] = sum(_bytes(r) for r in await runs_of(client, f"{session_id}/turn-{n}"))
        total += known[n]
    return total


async def _replay(
    client: Client, settings: Settings, session_id: str, first_run: str
) -> tuple[float | None, float | None, int]:
    """Milliseconds per turn to replay the session's last complete run, warm and cold, and its
    turns."""
    runs = await runs_of(client, session_id, first_run)
    if len(runs) < 2:
        return None, None, 0
    run = runs[-2]  # the last one that continued as new: complete
    turns = sum(
        1 for e in run if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    )
    history = WorkflowHistory(session_id, run)
    replayer = Replayer(workflows=[], plugins=[replay_plugin(settings)])
    await replayer.replay_workflow(history)  # warm: imports, the sandbox

    # The median of several: a worker replays runs all day, and one replay on a shared
    # machine can meet its neighbour's burst.
    async def median_ms(cold: bool) -> float:
        times = []
        for _ in range(REPLAYS):
            if cold:
                conversations.clear()
            started = time.perf_counter()
            await replayer.replay_workflow(history)
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000 / max(turns, 1)

    warm = await median_ms(cold=False)
    return warm, await median_ms(cold=True), turns


async def growth(
    env: Environment,
    kind: str,
    turns: int,
    checkpoints_at: tuple[int, ...] = CHECKPOINTS,
    *,
    replay: bool = True,
) -> Growth:
    directory = env.tmp / f"storage-{kind.replace(' ', '-')}"
    directory.mkdir(exist_ok=True)
    settings = Settings.model_validate(_config(directory, env.payloads, kind))
    queue = f"bench-storage-{uuid.uuid4().hex[:6]}"
    stored_before = _stored(env.payloads)
    points = [c for c in checkpoints_at if c <= turns] or [turns]
    checkpoints: list[Checkpoint] = []
    known: dict[int, int] = {}
    padding = "m" * _message_bytes(kind)
    async with build_worker(env.client, settings, function_tools=TOOLS, task_queue=queue):
        session = await open_session(env.client, agent=AGENT, task_queue=queue)
        first_run = (await session.handle.describe()).run_id or ""
        conversation = 0
        index = 0
        for n in range(1, turns + 1):
            sent = await session.send(f"message {n} {padding}".rstrip())
            async for message in session.messages(index, until_turn=sent.turn):
                index += 1
                conversation += len(message.model_dump_json())
            if padding:
                # A reader of the whole session, as the gateway's session page is.
                read = [m async for m in session.transcript()]
                assert len(read) == index, (len(read), index)
            if n in points:
                history = await _history_bytes(env.client, session.session_id, first_run, n, known)
                checkpoints.append(
                    Checkpoint(n, conversation, history, _stored(env.payloads) - stored_before)
                )
                progress(f"storage ({kind}): {n} of {turns} turns")
        replay_ms, cold_ms, replayed = (
            await _replay(env.client, settings, session.session_id, first_run)
            if replay
            else (None, None, 0)
        )
        await session.handle.terminate()
    return Growth(kind, checkpoints, replay_ms, replayed, cold_ms)


def table(
    results: list[Growth], floor_ms: float | None = None, *, title: str = ""
) -> tuple[Table, list[Target]]:
    out = Table(
        title or "Sessions: storage against the conversation",
        [
            "turns",
            "kind",
            "conversation (KB)",
            "history (KB)",
            "stored (KB)",
            "(history + stored) / conversation",
            f"budget: {FACTOR:g}× + 10 KB/turn (KB)",
        ],
    )
    size_ok, growth_ok, replay_ok = True, True, True
    exponents, replays = [], []
    for g in results:
        for c in g.checkpoints:
            out.add(
                f"{c.turns:,}",
                g.kind,
                f"{c.conversation / 1024:,.0f}",
                f"{c.history / 1024:,.0f}",
                f"{c.stored / 1024:,.0f}",
                f"{c.total / c.conversation:.2f}×",
                f"{c.allowed / 1024:,.0f}",
            )
            size_ok &= c.total <= c.allowed
        if g.exponent is not None:
            exponents.append(f"{g.kind}: {g.exponent:.2f}")
            growth_ok &= g.exponent <= EXPONENT_MAX
        if g.replay_ms_per_turn is not None:
            cold = g.cold_replay_ms_per_turn or 0.0
            replays.append(
                f"{g.kind} {g.replay_ms_per_turn:.1f} ms, cold {cold:.1f} ms "
                f"({g.replayed_turns} turns)"
            )
            replay_ok &= g.replay_ms_per_turn <= REPLAY_MS_MAX
    if floor_ms is not None:
        replays.append(f"floor {floor_ms:.1f} ms (the same workflow tasks, no turnkeep code)")
    out.notes.append(
        "*history*: every event of every run of the session and of each of its child turns; "
        "*stored*: what payload storage gained; *conversation*: the JSON of every message "
        "of the session's transcript. Checkpoints are of one session per kind as it grows "
        "(*tools*: each turn calls a tool that returns 5 KB; *N KB messages*: the user's, "
        "echoed by the model; *200 KB tool results*: 2 KB messages, each answered after a "
        "tool returning 200 KB; with large messages a reader also asks for the whole "
        "transcript after each turn)."
    )
    if any(g.kind in LARGE_KINDS for g in results):
        size = " (large messages)"
        return out, [
            Target(SIZE_TARGET + size, "met" if size_ok else "over at some checkpoint", size_ok),
            Target(GROWTH_TARGET + size, ", ".join(exponents), growth_ok and bool(exponents)),
        ]
    targets = [
        Target(
            SIZE_TARGET,
            "met at every checkpoint" if size_ok else "over at some checkpoint",
            size_ok,
        ),
        Target(
            GROWTH_TARGET,
            ", ".join(exponents) or "one checkpoint only",
            growth_ok and bool(exponents),
        ),
        Target(REPLAY_TARGET, ", ".join(replays) or "no complete run", replay_ok and bool(replays)),
    ]
    return out, targets


async def replay_floor(env: Environment, turns: int) -> float:
    """Milliseconds per turn to replay a ``SessionFloor`` of ``turns`` turns (the median of
    several replays): the same workflow tasks as a session's turns, none of turnkeep's code."""
    queue = f"bench-session-floor-{uuid.uuid4().hex[:6]}"
    workflows = [SessionFloor, SessionFloorTurn]
    async with floor_worker(env.plain, queue, workflows=workflows, activities=[]):
        handle = await env.plain.start_workflow(
            SessionFloor.run, turns, id=f"session-floor-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        for n in range(1, turns + 1):
            turn = await handle.execute_update("send", f"message {n}", result_type=int)
            await env.plain.get_workflow_handle(f"{handle.id}/turn-{turn}").result()
        await handle.result()
        history = await handle.fetch_history()
    replayer = Replayer(workflows=workflows, workflow_runner=FLOOR_RUNNER)
    await replayer.replay_workflow(history)
    times = []
    for _ in range(REPLAYS):
        started = time.perf_counter()
        await replayer.replay_workflow(history)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000 / turns


async def storage(env: Environment, turns: int) -> tuple[Table, list[Target]]:
    results = []
    for kind in KINDS:
        progress(f"storage: a session of {turns} {kind} turns")
        results.append(await growth(env, kind, turns))
    replayed = max((g.replayed_turns for g in results), default=0)
    floor = await replay_floor(env, replayed) if replayed else None
    return table(results, floor)


async def large(env: Environment, turns: int = LARGE_CHECKPOINTS[-1]) -> tuple[Table, list[Target]]:
    """Issue #43's sessions with large messages, measured at ``LARGE_CHECKPOINTS``."""
    results = []
    for kind in LARGE_KINDS:
        progress(f"storage: a session of {turns} turns, {kind}")
        results.append(await growth(env, kind, turns, LARGE_CHECKPOINTS, replay=False))
    return table(results, title="Sessions with large messages: storage against the conversation")
