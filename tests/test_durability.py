"""Durability, shown by killing real processes (issue 5, items 1, 2, 3 and 5).

Workers run as separate OS processes (``tests.worker_process``) and are SIGKILLed (a) while a
model call is in flight, (b) while a tool call is in flight, (c) between iterations; the
Temporal dev server itself is SIGKILLed and restarted on its SQLite file mid-turn; and a chaos
test kills workers at random under load. Tools run in a stdio MCP server
(``tests.mcp_servers_idempotent``) that logs each execution with the idempotency key it was
sent and the pid of the worker that called it, so executions are counted across processes.

What every test here asserts:

- the turn completes, and its conversation equals the one the same scripted turn produces
  without faults (volatile channels — ``tool_timing`` and ``usage`` — left out);
- a tool call whose completion the server had recorded when the worker was killed ran exactly
  once; the call that was in flight ran at most twice (in the dead worker, and in the one that
  completed it); under chaos, every repeated execution is explained by a SIGKILL of the worker
  that ran the earlier one (``assert_reran_only_after_a_kill``);
- every execution of a call was told the same idempotency key, ``<workflow id>/<call id>``.

Activities heartbeat every ``heartbeat / 3`` seconds and the agents here set ``heartbeat: 2``,
so a dead worker's call is retried within seconds. No test asserts on timing.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Context
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from tests.conftest import HarnessFactory, eventually, write_script
from tests.worker_process import WorkerProcesses, effects_server, write_config
from turnkeep.activities.tools import IDEMPOTENCY_KEY_META, idempotency_key
from turnkeep.client.connection import connect
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.testing.fake_api import FakeModelApi, Reply

# Servers and worker processes of its own, killed on purpose: slow, and marked so.
pytestmark = [pytest.mark.asyncio, pytest.mark.server, pytest.mark.slow]

TOOL = "effects__effect"
VOLATILE_CHANNELS = ("tool_timing", "usage")
FAST_RECOVERY = {"start_to_close": 60, "heartbeat": 2, "max_attempts": 5}
TURN_WITHIN = 120.0  # seconds a turn may take to finish, faults included


# --- scripted turns and what they leave behind ---------------------------------------------


def effect(tag: str, seconds: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"name": TOOL, "arguments": {"tag": tag, "seconds": seconds, **extra}}


def calls(**by_id: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": by_id}


# Two iterations: two tools in parallel, then one that takes a while, then the answer.
SLOW_SECONDS = 2.0
SCRIPT = [
    calls(c1=effect("a", 0.2), c2=effect("b", 0.4)),
    calls(c3=effect("c", SLOW_SECONDS)),
    "all done",
]


def stable(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as JSON without what legitimately differs between two runs of one script."""
    out = []
    for message in messages:
        data = message.model_dump(mode="json", exclude_none=True)
        channels = {
            k: v
            for k, v in (data.pop("channels", None) or {}).items()
            if k not in VOLATILE_CHANNELS
        }
        if channels:
            data["channels"] = channels
        out.append(data)
    return out


def executions(record: Path, workflow_id: str) -> dict[str, list[dict[str, Any]]]:
    """The effect server's log lines for one turn, per model call id, in order."""
    by_call: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if not record.exists():
        return by_call
    for line in record.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        wid, _, call_id = (entry["key"] or "").rpartition("/")
        if wid == workflow_id:
            by_call[call_id].append(entry)
    return by_call


def starts(record: Path, workflow_id: str, call_id: str) -> list[dict[str, Any]]:
    return [e for e in executions(record, workflow_id)[call_id] if e["event"] == "start"]


async def history_events(client: Client, workflow_id: str) -> list[Any]:
    return [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]


async def completed_tool_calls(client: Client, workflow_id: str) -> dict[str, float]:
    """Call id -> when the server recorded that call's completion (epoch seconds)."""
    scheduled: dict[int, str] = {}
    done: dict[str, float] = {}
    for event in await history_events(client, workflow_id):
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "call_tool":
                call_id = json.loads(attrs.input.payloads[0].data)["call_id"]
                scheduled[event.event_id] = call_id
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            if attrs.scheduled_event_id in scheduled:
                done[scheduled[attrs.scheduled_event_id]] = (
                    event.event_time.ToDatetime().timestamp()
                )
    return done


def assert_ran(record: Path, workflow_id: str, expected: set[str], once: Iterable[str]) -> None:
    """Each expected call ran at least once and at most twice, those in ``once`` exactly once,
    and every execution was told the same idempotency key."""
    by_call = executions(record, workflow_id)
    assert {c for c, log in by_call.items() if any(e["event"] == "start" for e in log)} == expected
    for call_id in expected:
        runs = [e for e in by_call[call_id] if e["event"] == "start"]
        assert 1 <= len(runs) <= (1 if call_id in once else 2), (call_id, runs)
        assert {e["key"] for e in runs} == {idempotency_key(workflow_id, call_id)}


def assert_reran_only_after_a_kill(
    record: Path,
    workflow_id: str,
    completed_at: dict[str, float],
    killed: dict[int, float],
    expected: set[str],
) -> None:
    """Exactly-once under random kills, precisely: each call completed once in history and ran
    at least once; every execution but the last ran in a worker that was SIGKILLed before the
    server recorded the call's completion (so a call whose completion was recorded before its
    worker died ran exactly once); and every execution was told the same idempotency key."""
    by_call = executions(record, workflow_id)
    assert set(completed_at) == expected
    for call_id in expected:
        runs = [e for e in by_call[call_id] if e["event"] == "start"]
        assert runs, f"{call_id} never ran"
        assert {e["key"] for e in runs} == {idempotency_key(workflow_id, call_id)}
        for run in runs[:-1]:
            assert run["worker"] in killed, f"{call_id} ran again though its worker lived"
            assert killed[run["worker"]] < completed_at[call_id]


# --- set-up ---------------------------------------------------------------------------------


def agent(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "servers": ["effects"],
        "llm_timeouts": FAST_RECOVERY,
        "tool_timeouts": FAST_RECOVERY,
        **model,
    }


def playback(path: Path, script: list[Any]) -> dict[str, Any]:
    return agent({"model": "playback", "playback": str(write_script(path, *script))})


def worker_config(
    directory: Path, task_queue: str, record: Path, agents: dict[str, Any], **top: Any
) -> Path:
    config = {
        "task_queue": task_queue,
        "mcp": {"servers": {"effects": effects_server(record)}},
        "agents": agents,
        **top,
    }
    return write_config(directory / "turnkeep.yaml", config)


class Fleet:
    """Worker processes for one task queue and config, shared by this module's tests: starting
    a worker process costs seconds of imports, so a test goes on with the worker the previous
    one left running."""

    def __init__(self, client: Client, workers: WorkerProcesses, task_queue: str, record: Path):
        self.client = client
        self.workers = workers
        self.task_queue = task_queue
        self.record = record

    async def single(self) -> int:
        """The one worker running (started if there is none; any others stopped)."""
        while len(self.workers.running) > 1:
            self.workers.stop(max(self.workers.running))
        if not self.workers.running:
            return await self.workers.start_polling(self.client, self.task_queue)
        (pid,) = self.workers.running
        await self.workers.wait_polling(self.client, self.task_queue, pid)
        return pid

    async def start(self, agent: str) -> TurnHandle:
        turn = TurnInput(agent=agent, messages=["go"])
        return await start_turn(self.client, turn, task_queue=self.task_queue)

    async def finish(self, turn: TurnHandle) -> TurnResult:
        try:
            return await asyncio.wait_for(turn.result(), TURN_WITHIN)
        except TimeoutError:
            logs = self.workers.log_tail()
            raise AssertionError(f"the turn did not finish; worker logs:\n{logs}") from None

    async def run(self, agent: str) -> TurnResult:
        return await self.finish(await self.start(agent))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelApi]:
    with FakeModelApi() as provider:
        yield provider


@pytest.fixture(scope="module")
async def fleet(
    client: Client,
    temporal: ServerInfo,
    fake: FakeModelApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Fleet]:
    directory = tmp_path_factory.mktemp("fleet")
    record = directory / "record.jsonl"
    task_queue = f"durable-{uuid.uuid4().hex[:10]}"
    agents = {
        "scripted": playback(directory / "scripted.json", SCRIPT),
        "fake": agent({"model": "anthropic.test-model"}),
        "fragile": {
            "model": "anthropic.test-model",
            "llm_timeouts": {"start_to_close": 60, "heartbeat": 2, "max_attempts": 2},
        },
        "charge": playback(directory / "charge.json", CHARGE_SCRIPT),
        **{name: chaos_agent(directory / f"{name}.json", s) for name, s in CHAOS_SCRIPTS.items()},
    }
    anthropic = {"api_key": "sk-test", "base_url": fake.base_url_anthropic}
    config = worker_config(directory, task_queue, record, agents, anthropic=anthropic)
    with WorkerProcesses(config, temporal.address, directory / "logs") as workers:
        yield Fleet(client, workers, task_queue, record)


@pytest.fixture(scope="module")
async def scripted_baseline(fleet: Fleet) -> list[dict[str, Any]]:
    """SCRIPT's conversation, run without faults."""
    await fleet.single()
    return stable((await fleet.run("scripted")).messages)


# --- item 1: SIGKILL the worker process -----------------------------------------------------


async def test_worker_killed_during_a_model_call(fleet: Fleet, fake: FakeModelApi) -> None:
    answers = [
        Reply.tool_calls(
            ("c1", TOOL, effect("a")["arguments"]), ("c2", TOOL, effect("b")["arguments"])
        ),
        Reply.tool_calls(("c3", TOOL, effect("c", 0.5)["arguments"])),
        Reply.text("all done"),
    ]
    first = await fleet.single()
    fake.reset()
    fake.script(*answers, api="anthropic")
    baseline = await fleet.run("fake")

    fake.reset()
    # The second model call hangs until the worker that made it dies; its retry is answered.
    fake.script(answers[0], Reply.delay(300, then=answers[1]), *answers[1:], api="anthropic")
    turn = await fleet.start("fake")
    await eventually(lambda: len(fake.requests) == 2, "the second model call is in flight")
    fleet.workers.kill(first)
    completed_before_kill = await completed_tool_calls(fleet.client, turn.workflow_id)
    await fleet.workers.start_polling(fleet.client, fleet.task_queue)
    result = await fleet.finish(turn)

    assert result.stop_reason == StopReason.END_TURN
    assert stable(result.messages) == stable(baseline.messages)
    assert len(fake.requests) == 4  # the interrupted model call was made again
    assert set(completed_before_kill) == {"c1", "c2"}
    # No tool was in flight at the kill: each ran exactly once.
    assert_ran(fleet.record, turn.workflow_id, {"c1", "c2", "c3"}, once={"c1", "c2", "c3"})


async def running_on(client: Client, workflow_id: str, activity_type: str) -> int | None:
    """The pid of the worker process running ``activity_type`` for a turn, if one is."""
    description = await client.get_workflow_handle(workflow_id).describe()
    for pending in description.raw_description.pending_activities:
        if pending.activity_type.name == activity_type and pending.last_worker_identity:
            return int(pending.last_worker_identity.split("@")[0])
    return None


async def test_a_model_call_interrupted_once_is_not_lost_with_a_standby_worker(
    fleet: Fleet, fake: FakeModelApi
) -> None:
    """One worker death costs a model call one retry: with 2 attempts and 2 s heartbeats, and a
    second worker already polling to take over, the turn goes on as if nothing happened."""
    await fleet.single()
    await fleet.workers.start_polling(fleet.client, fleet.task_queue)  # the standby
    fake.reset()
    # The first request hangs until its worker dies; any later one is answered.
    fake.script(Reply.delay(300, then=Reply.text("hello")), Reply.text("hello"))
    turn = await fleet.start("fragile")
    await eventually(lambda: len(fake.requests) == 1, "the model call is in flight")
    victim = await running_on(fleet.client, turn.workflow_id, "llm_step")
    assert victim is not None
    fleet.workers.kill(victim)
    result = await fleet.finish(turn)

    assert result.final is not None and result.final.text == "hello", result.final
    assert result.stop_reason == StopReason.END_TURN
    assert len(fake.requests) == 2  # the retry reached the provider


async def test_worker_killed_during_a_tool_call(
    fleet: Fleet, scripted_baseline: list[dict[str, Any]]
) -> None:
    first = await fleet.single()
    turn = await fleet.start("scripted")
    await eventually(lambda: starts(fleet.record, turn.workflow_id, "c3"), "c3 is running")
    fleet.workers.kill(first)
    completed_before_kill = await completed_tool_calls(fleet.client, turn.workflow_id)
    second = await fleet.workers.start_polling(fleet.client, fleet.task_queue)
    result = await fleet.finish(turn)

    assert result.stop_reason == StopReason.END_TURN
    assert stable(result.messages) == scripted_baseline
    assert set(completed_before_kill) == {"c1", "c2"}
    assert_ran(fleet.record, turn.workflow_id, {"c1", "c2", "c3"}, once=completed_before_kill)
    # The interrupted call ran twice, in the dead worker and in its replacement.
    runs = starts(fleet.record, turn.workflow_id, "c3")
    assert [run["worker"] for run in runs] == [first, second]


async def test_worker_killed_between_iterations(
    fleet: Fleet, scripted_baseline: list[dict[str, Any]]
) -> None:
    first = await fleet.single()
    turn = await fleet.start("scripted")
    # The first batch's results are in history: the worker is between iterations (or already
    # into the next one: wherever exactly the kill lands, the same must hold).
    await eventually(
        lambda: _has_completed(fleet.client, turn.workflow_id, {"c1", "c2"}),
        "the first tool batch completed",
    )
    fleet.workers.kill(first)
    completed_before_kill = await completed_tool_calls(fleet.client, turn.workflow_id)
    await fleet.workers.start_polling(fleet.client, fleet.task_queue)
    result = await fleet.finish(turn)

    assert result.stop_reason == StopReason.END_TURN
    assert stable(result.messages) == scripted_baseline
    assert {"c1", "c2"} <= set(completed_before_kill)
    assert_ran(fleet.record, turn.workflow_id, {"c1", "c2", "c3"}, once=completed_before_kill)


async def _has_completed(client: Client, workflow_id: str, call_ids: set[str]) -> bool:
    return call_ids <= set(await completed_tool_calls(client, workflow_id))


# --- item 2: SIGKILL the Temporal server ----------------------------------------------------


async def test_server_killed_and_restarted_on_its_database_mid_turn(
    scripted_baseline: list[dict[str, Any]], tmp_path: Path
) -> None:
    server = EmbeddedServer(db_file=tmp_path / "temporal.db", ui=False)
    info = await server.start()
    try:
        client = await connect(info.address, info.namespace)
        record = tmp_path / "record.jsonl"
        task_queue = f"durable-{uuid.uuid4().hex[:10]}"
        agents = {"scripted": playback(tmp_path / "scripted.json", SCRIPT)}
        config = worker_config(tmp_path, task_queue, record, agents)
        with WorkerProcesses(config, info.address, tmp_path / "logs") as workers:
            fleet = Fleet(client, workers, task_queue, record)
            worker = await fleet.single()
            turn = await fleet.start("scripted")
            await eventually(lambda: starts(record, turn.workflow_id, "c3"), "c3 is running")
            completed_before_kill = await completed_tool_calls(client, turn.workflow_id)
            server.kill()
            await server.start()  # same port, same SQLite file
            result = await fleet.finish(turn)
            status = (await turn.handle.describe()).status
            worker_survived = worker in workers.running and workers.running[worker].poll() is None
    finally:
        await server.stop()

    assert status == WorkflowExecutionStatus.COMPLETED
    assert worker_survived  # the worker rode out the outage: it was never restarted
    assert result.stop_reason == StopReason.END_TURN
    assert stable(result.messages) == scripted_baseline
    assert set(completed_before_kill) == {"c1", "c2"}
    assert_ran(record, turn.workflow_id, {"c1", "c2", "c3"}, once=completed_before_kill)


# --- item 3: idempotency keys ---------------------------------------------------------------


def keyed(tag: str, ctx: Context) -> str:
    """Say which idempotency key this call was given."""
    meta = ctx.request_context.meta if ctx.request_context else None
    return f"{tag}: {(meta or {}).get(IDEMPOTENCY_KEY_META)}"


async def test_function_tools_are_told_their_idempotency_key(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path / "script.json",
        calls(k1={"name": "local__keyed", "arguments": {"tag": "x"}}),
        "ok",
    )
    local = {"model": "playback", "playback": str(script), "servers": ["local"]}
    async with harness({"local": [keyed]}, agents={"test": local}) as h:
        turn = await h.start("go")
        result = await turn.result()
    tool_results = result.messages[2].tool_results
    assert tool_results is not None
    assert tool_results["k1"].text == f"x: {turn.workflow_id}/k1"


CHARGE_SCRIPT = [calls(c1=effect("charge", SLOW_SECONDS, dedupe=True)), "charged"]


async def test_a_retried_call_gets_the_same_key_and_can_deduplicate(fleet: Fleet) -> None:
    first = await fleet.single()
    turn = await fleet.start("charge")

    def applied() -> bool:
        return any(
            e["event"] == "applied" for e in executions(fleet.record, turn.workflow_id)["c1"]
        )

    await eventually(applied, "the side effect was applied")
    fleet.workers.kill(first)  # after the side effect, before the tool returned
    second = await fleet.workers.start_polling(fleet.client, fleet.task_queue)
    result = await fleet.finish(turn)

    assert result.final is not None and result.final.text == "charged"
    log = executions(fleet.record, turn.workflow_id)["c1"]
    # Two executions, one per worker, told the same key: the second saw the first had applied
    # the side effect and did not apply it again.
    assert [(e["event"], e["worker"]) for e in log if e["event"] != "done"] == [
        ("start", first),
        ("applied", first),
        ("start", second),
        ("skipped", second),
    ]
    assert {e["key"] for e in log} == {f"{turn.workflow_id}/c1"}


# --- item 5: chaos --------------------------------------------------------------------------

CHAOS_TURNS = 20
CHAOS_SEED = 5
CHAOS_MAX_KILLS = 6
CHAOS_SCRIPTS = {
    "wide": [
        calls(w1=effect("w1", 0.3), w2=effect("w2", 0.6), w3=effect("w3", 0.1)),
        calls(w4=effect("w4", 1.0), w5=effect("w5", 0.2)),
        calls(w6=effect("w6", 0.5)),
        "wide done",
    ],
    "deep": [
        *(
            calls(**{f"d{i}": effect(f"d{i}", 0.4), f"e{i}": effect(f"e{i}", 0.2)})
            for i in range(4)
        ),
        "deep done",
    ],
}


def chaos_agent(path: Path, script: list[Any]) -> dict[str, Any]:
    # More attempts than the other agents: here kills keep coming, and one model call may be
    # interrupted several times.
    return {**playback(path, script), "llm_timeouts": {**FAST_RECOVERY, "max_attempts": 10}}


async def test_chaos_many_turns_while_workers_are_killed_at_random(fleet: Fleet) -> None:
    """20 concurrent turns (3–4 iterations each, parallel tools) while worker processes are
    SIGKILLed at random (seeded) and replaced. Afterwards every turn has completed with the
    conversation a fault-free run of its script gives, and exactly-once holds as
    ``assert_reran_only_after_a_kill`` states it."""
    rng = random.Random(CHAOS_SEED)
    workers = fleet.workers
    await fleet.single()
    baselines = {name: stable((await fleet.run(name)).messages) for name in CHAOS_SCRIPTS}
    kills_before = len(workers.killed)
    await workers.start_polling(fleet.client, fleet.task_queue)  # two workers share the load

    names = [rng.choice(sorted(CHAOS_SCRIPTS)) for _ in range(CHAOS_TURNS)]
    turns = await asyncio.gather(*(fleet.start(name) for name in names))
    results = asyncio.ensure_future(asyncio.gather(*(fleet.finish(t) for t in turns)))
    # Every 1–3 s a random worker is SIGKILLed and a replacement started at once (not waited
    # for), until the turns are done or enough workers have died; the survivors finish.
    while len(workers.killed) - kills_before < CHAOS_MAX_KILLS:
        await asyncio.wait({results}, timeout=rng.uniform(1.0, 3.0))
        if results.done():
            break
        workers.kill(rng.choice(sorted(workers.running)))
        workers.start()
    finished = await results
    completed = [await completed_tool_calls(fleet.client, t.workflow_id) for t in turns]

    assert len(workers.killed) > kills_before  # the chaos did happen, mid-flight
    for name, turn, result, completed_at in zip(names, turns, finished, completed, strict=True):
        assert result.stop_reason == StopReason.END_TURN
        assert stable(result.messages) == baselines[name], turn.workflow_id
        expected = {cid for m in CHAOS_SCRIPTS[name][:-1] for cid in m["tool_calls"]}
        assert_reran_only_after_a_kill(
            fleet.record, turn.workflow_id, completed_at, workers.killed, expected
        )
