"""Sessions (issue #23): one long session, and many idle ones.

**A long session.** One ``SessionWorkflow`` answers ``turns`` short messages, one after the
other, as ``turnkeep chat`` does: ``send``, then follow the session's messages until that turn
has ended. Each turn is the ``playback`` model answering at once (no tools, no network). The
session continues as new every ``turns_per_run`` turns (50 by default), carrying the
conversation. Reported: the events and bytes of each of the session's runs (the largest, and
the first and last full runs: carried state must not make later runs bigger), the history of
the 10th and the last turn (a child ``TurnWorkflow`` whose input holds the whole conversation so
far), what payload storage gained over the session, and how long the 10th and the last turns
took (medians over windows of ``WINDOW`` turns around them, to keep a lone hiccup of the
machine out): send → accepted (``send`` returns: the turn has started) and send → completed
(its last message has reached the follower and the session has taken the turn in).

**Idle sessions.** ``count`` sessions, each after one turn, idle, on a worker process
(``bench.waiting_worker``) caching ``count`` + 10 workflows (none leaves its cache to make
room) whose ``worker.idle_session_cache`` is ``IDLE_CACHE_S``: once every session has been idle
for longer and has left the cache, the worker's resident memory (RSS) per idle session and the
workflows its cache holds (the Core SDK's gauge); then how long a message to such a session
takes to start its turn (``send`` → accepted), which replays the session from its history. An
idle session runs no activity and no timer (without an ``idle_timeout``). Within its
``idle_session_cache`` an idle session is cached, and costs the worker what any cached session
costs.
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.environment import Environment
from bench.memory import _gathered, _settled_rss
from bench.report import Table, Target, progress
from bench.turns import runs_of, until, until_true
from bench.waiting_worker import worker_process
from turnkeep.client.sessions import SessionHandle, get_session, open_session
from turnkeep.client.turns import get_turn
from turnkeep.config.settings import Settings
from turnkeep.worker.build import build_worker

AGENT = "short"
WINDOW = 10  # turns per timing window
# Above the sessions and turns in flight at once (AT_ONCE of each): a cache smaller than the
# workflows with work outstanding makes the worker evict and replay them over and over.
AT_ONCE = 20
# The idle sessions' worker.idle_session_cache (the default is 5 minutes).
IDLE_CACHE_S = 1
# Idle sessions that are sent a message once they have left the cache.
RETURNING = 20
RATIO_MAX = 1.25
START_TARGET = f"the last turn of a long session starts as fast as the 10th (≤ {RATIO_MAX}×)"
END_TARGET = f"the last turn of a long session completes as fast as the 10th (≤ {RATIO_MAX}×)"
BOUNDED_TARGET = "a long session's runs stay bounded: the last full run ≤ 1.25× the first's bytes"
TARGETS = [START_TARGET, END_TARGET, BOUNDED_TARGET]


def agent_config(directory: Path, payloads: Path) -> dict[str, Any]:
    """turnkeep.yaml with one agent answering every turn at once; payloads in the bench
    client's storage."""
    script = directory / f"{AGENT}.json"
    script.write_text(json.dumps(["done"]), encoding="utf-8")
    return {
        "base_dir": str(directory),
        "payload_storage": {"path": str(payloads)},
        "agents": {AGENT: {"model": "playback", "playback": str(script), "max_iterations": 1}},
    }


# -- a long session ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    events: int
    bytes: int


@dataclass(frozen=True)
class LongSession:
    turns: int
    accepted: list[float]  # seconds, per turn, from send to its answer
    completed: list[float]  # seconds, per turn, from send to the turn taken in
    queued: int  # sends answered as queued (none expected: each waits for the last turn)
    runs: list[Run]
    turn_runs: dict[int, Run]  # the 10th and the last turn's own history
    stored_bytes: int  # what payload storage gained over the session (files and bytes)
    stored_files: int

    def window(self, values: list[float], turn: int) -> float:
        """The median of ``values`` over the ``WINDOW`` turns ending at ``turn`` (1-based),
        or starting at turn 1 if fewer precede it."""
        end = max(turn, WINDOW)
        return statistics.median(values[end - WINDOW : end])

    def ratio(self, values: list[float]) -> float:
        return self.window(values, self.turns) / self.window(values, 10)


async def long_session(env: Environment, turns: int) -> LongSession:
    directory = env.tmp / "sessions"
    directory.mkdir(exist_ok=True)
    settings = Settings.model_validate(agent_config(directory, env.payloads))
    queue = f"bench-session-{uuid.uuid4().hex[:6]}"
    files_before, bytes_before = _stored(env.payloads)
    accepted: list[float] = []
    completed: list[float] = []
    queued = 0
    async with build_worker(env.client, settings, task_queue=queue):
        session = await open_session(env.client, agent=AGENT, task_queue=queue)
        index = 0
        for n in range(1, turns + 1):
            started = time.perf_counter()
            sent = await session.send(f"message {n}")
            accepted.append(time.perf_counter() - started)
            queued += sent.queued
            async for _ in session.messages(index, until_turn=sent.turn):
                index += 1
            completed.append(time.perf_counter() - started)
            if n % 100 == 0:
                progress(f"sessions: {n} of {turns} turns")
        await session.close()
        await session.result()
    # Every run, from the first (a handle without a run id reads only the latest).
    described = await session.handle.describe()
    first = described.raw_description.workflow_execution_info.first_run_id
    runs = await runs_of(env.client, session.session_id, first or None)
    turn_runs = {}
    for n in (10, turns):
        [events] = await runs_of(env.client, f"{session.session_id}/turn-{n}")
        turn_runs[n] = _run(events)
    files, stored = _stored(env.payloads)
    return LongSession(
        turns,
        accepted,
        completed,
        queued,
        [_run(r) for r in runs],
        turn_runs,
        stored - bytes_before,
        files - files_before,
    )


def _stored(directory: Path) -> tuple[int, int]:
    """The files in a payload-storage directory and their bytes."""
    sizes = [f.stat().st_size for f in directory.rglob("*") if f.is_file()]
    return len(sizes), sum(sizes)


def _run(events: list[Any]) -> Run:
    return Run(len(events), sum(e.ByteSize() for e in events))


def long_session_table(s: LongSession) -> tuple[Table, list[Target]]:
    out = Table(
        f"Sessions: one session of {s.turns:,} short turns ({len(s.runs)} runs)",
        [
            "what",
            f"turn 10 (median of turns 1–{WINDOW})",
            f"turn {s.turns:,} (median of last {WINDOW})",
            "ratio",
        ],
    )
    for name, values in (
        ("send → accepted (ms)", s.accepted),
        ("send → completed (ms)", s.completed),
    ):
        out.add(
            name,
            f"{s.window(values, 10) * 1000:.0f}",
            f"{s.window(values, s.turns) * 1000:.0f}",
            f"{s.ratio(values):.2f}×",
        )
    early, late = s.turn_runs[10], s.turn_runs[s.turns]
    out.add(
        "the turn's own history: events / KB",
        f"{early.events} / {early.bytes / 1024:.1f}",
        f"{late.events} / {late.bytes / 1024:.1f}",
        f"{late.bytes / early.bytes:.2f}×",
    )
    full = s.runs[:-1] or s.runs
    largest = max(s.runs, key=lambda r: r.bytes)
    out.notes.append(
        f"Session runs: largest {max(r.events for r in s.runs)} events / "
        f"{largest.bytes / 1024:.1f} KB; first run {full[0].events} events / "
        f"{full[0].bytes / 1024:.1f} KB, last full run {full[-1].events} events / "
        f"{full[-1].bytes / 1024:.1f} KB. Payload storage gained {s.stored_files:,} files, "
        f"{s.stored_bytes / 2**20:.1f} MB (each turn's input and result over the threshold "
        f"hold the conversation so far). {s.queued} of {s.turns:,} sends were queued. "
        "*accepted*: `send` returned, the turn has started; *completed*: its answer has "
        "reached the follower and the session has taken the turn in."
    )
    start, end = s.ratio(s.accepted), s.ratio(s.completed)
    bounded = full[-1].bytes / full[0].bytes
    targets = [
        Target(START_TARGET, f"{start:.2f}×", start <= RATIO_MAX),
        Target(END_TARGET, f"{end:.2f}×", end <= RATIO_MAX),
        Target(
            BOUNDED_TARGET,
            f"{bounded:.2f}× ({full[-1].bytes / 1024:.1f} KB, {full[-1].events} events; "
            f"largest run {largest.bytes / 1024:.1f} KB)",
            bounded <= 1.25,
        ),
    ]
    return out, targets


# -- idle sessions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Idle:
    count: int
    before_bytes: int
    cached: float | None  # workflows in the worker's cache, every session idle past IDLE_CACHE_S
    with_bytes: int
    accepted: list[float]  # seconds from `send` to its answer, to sessions out of the cache

    @property
    def per_session(self) -> float:
        return (self.with_bytes - self.before_bytes) / self.count


async def _one_turn(client: Client, session: SessionHandle) -> None:
    """One turn, until the session has taken it in, as the server sees it: its child has
    ended and no workflow task of it is pending. Not by following it (``messages``) or
    querying it: each query of a session the worker's cache no longer holds replays it there,
    and hundreds of such queries at once are what this must not measure."""
    sent = await session.send("hello")
    await get_turn(client, sent.turn_id).handle.result()

    async def taken_in() -> bool | None:
        described = (await session.handle.describe()).raw_description
        idle = not described.pending_children and not described.HasField("pending_workflow_task")
        return True if idle else None

    await until(taken_in, f"{session.session_id} to take its turn in", within=600)


async def idle_sessions(env: Environment, count: int) -> Idle:
    directory = env.tmp / "idle"
    directory.mkdir(exist_ok=True)
    path = directory / "turnkeep.yaml"
    config = agent_config(directory, env.payloads)
    config["worker"] = {"idle_session_cache": f"{IDLE_CACHE_S}s"}
    path.write_text(json.dumps(config), encoding="utf-8")
    queue = f"bench-idle-{uuid.uuid4().hex[:6]}"
    info = env.info
    with worker_process(info.address, info.namespace, queue, path, count + 10, directory) as w:
        await until_true(lambda: w.report() is not None, "the session worker to start", 120)
        for _ in range(2):  # warm up: imports, the sandbox, a session's turn and its close
            warm = await open_session(env.client, agent=AGENT, task_queue=queue)
            await _one_turn(env.client, warm)
            await warm.close()
            await warm.result()
        before = await _settled_rss(w.pid, 1.0)
        progress(f"sessions: {count} sessions of one turn each, then idle")
        ids = [f"{queue}-{i}" for i in range(count)]

        async def one(session_id: str) -> None:
            session = await open_session(
                env.client, agent=AGENT, session_id=session_id, task_queue=queue
            )
            await _one_turn(env.client, session)

        await _gathered([partial(one, sid) for sid in ids], at_once=AT_ONCE)
        await until_true(lambda: w.cached_workflows() == 0, "the idle sessions to leave", 600)
        with_ = await _settled_rss(w.pid)
        cached = w.cached_workflows()
        accepted = []
        for sid in ids[:RETURNING]:
            sent_at = time.perf_counter()
            await get_session(env.client, sid).send("hello again")
            accepted.append(time.perf_counter() - sent_at)
        await _gathered([get_session(env.client, sid).handle.terminate for sid in ids])
    return Idle(count, before, cached, with_, accepted)


def idle_table(r: Idle) -> Table:
    out = Table(
        "Idle sessions: worker memory",
        ["idle sessions", "workflows cached", "RSS before / with (MB)", "per idle session (KB)"],
    )
    out.add(
        f"{r.count:,}",
        "?" if r.cached is None else f"{r.cached:,.0f}",
        f"{r.before_bytes / 2**20:.0f} / {r.with_bytes / 2**20:.0f}",
        f"{r.per_session / 1024:.0f}",
    )
    out.notes.append(
        "RSS of the worker process (/proc/PID/status VmRSS) after two warm-up sessions, then "
        f"with every session idle after its one turn for longer than its {IDLE_CACHE_S} s "
        "idle_session_cache (the highest over 3 s): what is left is what the worker's "
        f"allocators kept from the sessions starting, {AT_ONCE} at a time, each cached until "
        "it had been idle that long. *workflows cached*: the worker's sticky-cache gauge "
        "(temporal_sticky_cache_size). A message to a session out of the cache replays it: "
        f"`send` → accepted took {statistics.median(r.accepted) * 1000:.0f} ms at the median "
        f"over {len(r.accepted)} such sessions (one turn each, one at a time)."
    )
    return out


async def sessions(env: Environment, turns: int, idle: int) -> tuple[list[Table], list[Target]]:
    progress(f"sessions: one session of {turns} turns")
    long = await long_session(env, turns)
    table, targets = long_session_table(long)
    try:
        result = await idle_sessions(env, idle)
    except Exception as err:  # keep the long session's figures
        progress(f"sessions: idle sessions failed:\n{traceback.format_exc()}")
        table.notes.append(f"**Idle sessions failed** (traceback on stderr): {err!r}")
        return [table], targets
    return [table, idle_table(result)], targets
