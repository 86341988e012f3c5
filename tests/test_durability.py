"""Durability, shown by killing real processes (issue 5, items 1, 2, 3 and 5).

Workers run as separate OS processes (``tests/worker_process.py``) and are SIGKILLed (a) while a
model call is in flight, (b) while a tool call is in flight, (c) between iterations; the
Temporal dev server itself is SIGKILLed and restarted on its SQLite file mid-turn; and a chaos
test kills workers at random under load. Tools run in a stdio MCP server
(``tests/mcp_servers_idempotent.py``) that logs each execution with the idempotency key it was
sent and the pid of the worker that called it, so executions are counted across processes.

What every test here asserts:

- the turn completes, and its conversation equals the one the same scripted turn produces
  without faults (volatile channels — ``tool_timing`` and ``usage`` — left out);
- a tool call whose completion the server had recorded when the worker was killed ran exactly
  once; any other call ran at least once and at most twice (once per worker that died with it
  in flight, plus the attempt that completed);
- every execution of a call was told the same idempotency key, ``<workflow id>/<call id>``.

Activities heartbeat every ``heartbeat / 3`` seconds and the agents here set ``heartbeat: 2``,
so a dead worker's call is retried within seconds. No test asserts on timing.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Context
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from activities.tool_activities import IDEMPOTENCY_KEY_META, idempotency_key
from tests.conftest import HarnessFactory, write_script
from tests.fake_provider import FakeProvider, Reply
from tests.worker_process import WorkerProcesses, effects_server, write_config
from worker.client import TurnHandle, start_turn
from worker.connection import connect
from worker.embedded import EmbeddedServer, ServerInfo
from workflows.messages import Message, StopReason
from workflows.turn_io import TurnInput, TurnResult

pytestmark = pytest.mark.asyncio

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
SLOW_SECONDS = 4.0
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


async def until(check: Callable[[], Awaitable[bool] | bool], what: str, within: float = 60.0):
    deadline = time.monotonic() + within
    while True:
        outcome = check()
        if isinstance(outcome, Awaitable):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.02)


def assert_once_or_retried_after_a_kill(
    record: Path,
    workflow_id: str,
    completed_at: dict[str, float],
    killed: dict[int, float],
    expected_calls: set[str],
) -> None:
    """The exactly-once property, precisely: each call ran at least once; every execution but
    the last ran in a worker that was SIGKILLed before the server recorded the call's completion
    (so a call completed before its worker died ran exactly once); and every execution was told
    the same idempotency key."""
    by_call = executions(record, workflow_id)
    assert set(completed_at) == expected_calls
    for call_id in expected_calls:
        runs = [e for e in by_call[call_id] if e["event"] == "start"]
        assert runs, f"{call_id} never ran"
        assert {e["key"] for e in runs} == {idempotency_key(workflow_id, call_id)}
        for run in runs[:-1]:
            assert run["worker"] in killed, f"{call_id} ran again though its worker lived"
            assert killed[run["worker"]] < completed_at[call_id]
        assert len(runs) <= 1 + len(killed)


# --- set-up ---------------------------------------------------------------------------------


class Setup:
    """One test's worker config (written for worker processes), record file and task queue."""

    def __init__(self, tmp_path: Path, address: str, agent: dict[str, Any], **top: Any) -> None:
        self.record = tmp_path / "record.jsonl"
        self.task_queue = f"durable-{uuid.uuid4().hex[:10]}"
        config = {
            "task_queue": self.task_queue,
            "mcp": {"servers": {"effects": effects_server(self.record)}},
            "agents": {
                "test": {
                    "servers": ["effects"],
                    "llm_timeouts": FAST_RECOVERY,
                    "tool_timeouts": FAST_RECOVERY,
                    **agent,
                }
            },
            **top,
        }
        self.config = write_config(tmp_path / "turnkeep.yaml", config)
        self.address = address
        self.logs = tmp_path / "logs"

    def workers(self) -> WorkerProcesses:
        return WorkerProcesses(self.config, self.address, self.logs)

    async def start(self, client: Client, prompt: str = "go") -> TurnHandle:
        turn = TurnInput(agent="test", messages=[prompt])
        return await start_turn(client, turn, task_queue=self.task_queue)


def playback(tmp_path: Path, script: list[Any] = SCRIPT) -> dict[str, Any]:
    return {"model": "playback", "playback": str(write_script(tmp_path / "script.json", *script))}


async def finish(turn: TurnHandle, workers: WorkerProcesses) -> TurnResult:
    try:
        return await asyncio.wait_for(turn.result(), TURN_WITHIN)
    except TimeoutError:
        raise AssertionError(
            f"the turn did not finish; worker logs:\n{workers.log_tail()}"
        ) from None


# --- item 1: SIGKILL the worker process -----------------------------------------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


async def test_worker_killed_during_a_model_call(
    client: Client, temporal: ServerInfo, fake: FakeProvider, tmp_path: Path
) -> None:
    fake.reset()
    agent = {"model": "anthropic.test-model"}
    anthropic = {"api_key": "sk-test", "base_url": fake.base_url_anthropic}
    setup = Setup(tmp_path, temporal.address, agent, anthropic=anthropic)
    answers = [
        Reply.tool_calls(
            ("c1", TOOL, effect("a")["arguments"]), ("c2", TOOL, effect("b")["arguments"])
        ),
        Reply.tool_calls(("c3", TOOL, effect("c", 0.5)["arguments"])),
        Reply.text("all done"),
    ]
    with setup.workers() as workers:
        first = await workers.start_polling(client, setup.task_queue)
        fake.script(*answers, api="anthropic")
        baseline = await finish(await setup.start(client), workers)

        fake.reset()
        # The second model call hangs until the worker that made it dies; its retry is answered.
        fake.script(answers[0], Reply.delay(300, then=answers[1]), *answers[1:], api="anthropic")
        turn = await setup.start(client)
        await until(lambda: len(fake.requests) == 2, "the second model call is in flight")
        workers.kill(first)
        completed_before_kill = await completed_tool_calls(client, turn.workflow_id)
        await workers.start_polling(client, setup.task_queue)
        result = await finish(turn, workers)
        completed_at = await completed_tool_calls(client, turn.workflow_id)

    assert result.stop_reason == StopReason.END_TURN
    assert stable(result.messages) == stable(baseline.messages)
    assert len(fake.requests) == 4  # the interrupted model call was made again
    assert set(completed_before_kill) == {"c1", "c2"}
    for call_id in ("c1", "c2", "c3"):  # no tool was in flight: each ran exactly once
        assert len(starts(setup.record, turn.workflow_id, call_id)) == 1
    assert_once_or_retried_after_a_kill(
        setup.record, turn.workflow_id, completed_at, workers.killed, {"c1", "c2", "c3"}
    )


async def test_worker_killed_during_a_tool_call(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    setup = Setup(tmp_path, temporal.address, playback(tmp_path))
    with setup.workers() as workers:
        first = await workers.start_polling(client, setup.task_queue)
        baseline = await finish(await setup.start(client), workers)

        turn = await setup.start(client)
        await until(lambda: starts(setup.record, turn.workflow_id, "c3"), "c3 is running")
        workers.kill(first)
        completed_before_kill = await completed_tool_calls(client, turn.workflow_id)
        second = await workers.start_polling(client, setup.task_queue)
        result = await finish(turn, workers)
        completed_at = await completed_tool_calls(client, turn.workflow_id)

    assert result.stop_reason == StopReason.END_TURN
    assert stable(result.messages) == stable(baseline.messages)
    assert set(completed_before_kill) == {"c1", "c2"}
    for call_id in completed_before_kill:
        assert len(starts(setup.record, turn.workflow_id, call_id)) == 1
    # The interrupted call ran twice: once in the dead worker, once in its replacement, and
    # both executions were given the same idempotency key.
    runs = starts(setup.record, turn.workflow_id, "c3")
    assert [run["worker"] for run in runs] == [first, second]
    assert {run["key"] for run in runs} == {f"{turn.workflow_id}/c3"}
    assert_once_or_retried_after_a_kill(
        setup.record, turn.workflow_id, completed_at, workers.killed, {"c1", "c2", "c3"}
    )


async def test_worker_killed_between_iterations(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    setup = Setup(tmp_path, temporal.address, playback(tmp_path))
    with setup.workers() as workers:
        first = await workers.start_polling(client, setup.task_queue)
        baseline = await finish(await setup.start(client), workers)

        turn = await setup.start(client)
        # The first batch's results are in history: the worker is now between iterations (or
        # already into the next one: wherever the kill lands, the same must hold).
        await until(
            lambda: _has_completed(client, turn.workflow_id, {"c1", "c2"}),
            "the first tool batch completed",
        )
        workers.kill(first)
        completed_before_kill = await completed_tool_calls(client, turn.workflow_id)
        await workers.start_polling(client, setup.task_queue)
        result = await finish(turn, workers)
        completed_at = await completed_tool_calls(client, turn.workflow_id)

    assert result.stop_reason == StopReason.END_TURN
    assert stable(result.messages) == stable(baseline.messages)
    assert {"c1", "c2"} <= set(completed_before_kill)
    for call_id in ("c1", "c2"):
        assert len(starts(setup.record, turn.workflow_id, call_id)) == 1
    assert_once_or_retried_after_a_kill(
        setup.record, turn.workflow_id, completed_at, workers.killed, {"c1", "c2", "c3"}
    )


async def _has_completed(client: Client, workflow_id: str, call_ids: set[str]) -> bool:
    return call_ids <= set(await completed_tool_calls(client, workflow_id))


# --- item 2: SIGKILL the Temporal server ----------------------------------------------------


async def test_server_killed_and_restarted_on_its_database_mid_turn(tmp_path: Path) -> None:
    server = EmbeddedServer(db_file=tmp_path / "temporal.db", ui=False)
    info = await server.start()
    try:
        client = await connect(info.address, info.namespace)
        setup = Setup(tmp_path, info.address, playback(tmp_path))
        with setup.workers() as workers:
            await workers.start_polling(client, setup.task_queue)
            baseline = await finish(await setup.start(client), workers)

            turn = await setup.start(client)
            await until(lambda: starts(setup.record, turn.workflow_id, "c3"), "c3 is running")
            completed_before_kill = await completed_tool_calls(client, turn.workflow_id)
            server.kill()
            await server.start()  # same port, same SQLite file
            result = await finish(turn, workers)
            completed_at = await completed_tool_calls(client, turn.workflow_id)
            status = (await turn.handle.describe()).status
    finally:
        await server.stop()

    assert status == WorkflowExecutionStatus.COMPLETED
    assert result.stop_reason == StopReason.END_TURN
    assert stable(result.messages) == stable(baseline.messages)
    assert set(completed_before_kill) == {"c1", "c2"}
    for call_id in ("c1", "c2"):
        assert len(starts(setup.record, turn.workflow_id, call_id)) == 1
    # No worker died, so no call may have run twice (the server kept its promises on disk).
    assert_once_or_retried_after_a_kill(
        setup.record, turn.workflow_id, completed_at, {}, {"c1", "c2", "c3"}
    )


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
    agent = {"model": "playback", "playback": str(script), "servers": ["local"]}
    async with harness({"local": [keyed]}, agents={"test": agent}) as h:
        turn = await h.start("go")
        result = await turn.result()
    tool_results = result.messages[2].tool_results
    assert tool_results is not None
    assert tool_results["k1"].text == f"x: {turn.workflow_id}/k1"


async def test_a_retried_call_gets_the_same_key_and_can_deduplicate(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    script = [calls(c1=effect("charge", SLOW_SECONDS, dedupe=True)), "charged"]
    setup = Setup(tmp_path, temporal.address, playback(tmp_path, script))
    with setup.workers() as workers:
        first = await workers.start_polling(client, setup.task_queue)
        turn = await setup.start(client)
        await until(
            lambda: any(
                e["event"] == "applied" for e in executions(setup.record, turn.workflow_id)["c1"]
            ),
            "the side effect was applied",
        )
        workers.kill(first)  # after the side effect, before the tool returned
        second = await workers.start_polling(client, setup.task_queue)
        result = await finish(turn, workers)

    assert result.final is not None and result.final.text == "charged"
    log = executions(setup.record, turn.workflow_id)["c1"]
    by_worker = [(e["event"], e["worker"]) for e in log if e["event"] != "done"]
    # Two executions, one per worker, the same key: the second recognised the first.
    assert by_worker == [
        ("start", first),
        ("applied", first),
        ("start", second),
        ("skipped", second),
    ]
    assert {e["key"] for e in log} == {f"{turn.workflow_id}/c1"}


# --- item 5: chaos --------------------------------------------------------------------------

CHAOS_TURNS = 24
CHAOS_SEED = 5
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


async def test_chaos_many_turns_while_workers_are_killed_at_random(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    """24 concurrent turns (several iterations, parallel tools each) while worker processes are
    SIGKILLed at random (seeded) and replaced. Afterwards every turn has completed with the
    conversation a fault-free run of its script produces, and the exactly-once property holds
    as ``assert_once_or_retried_after_a_kill`` states it."""
    rng = random.Random(CHAOS_SEED)
    record = tmp_path / "record.jsonl"
    task_queue = f"chaos-{uuid.uuid4().hex[:10]}"
    agents = {
        name: {
            "model": "playback",
            "playback": str(write_script(tmp_path / f"{name}.json", *script)),
            "servers": ["effects"],
            "llm_timeouts": FAST_RECOVERY,
            "tool_timeouts": FAST_RECOVERY,
        }
        for name, script in CHAOS_SCRIPTS.items()
    }
    config = write_config(
        tmp_path / "turnkeep.yaml",
        {
            "task_queue": task_queue,
            "mcp": {"servers": {"effects": effects_server(record)}},
            "agents": agents,
        },
    )

    async def start(agent: str) -> TurnHandle:
        turn = TurnInput(agent=agent, messages=["go"])
        return await start_turn(client, turn, task_queue=task_queue)

    with WorkerProcesses(config, temporal.address, tmp_path / "logs") as workers:
        await asyncio.gather(*(workers.start_polling(client, task_queue) for _ in range(2)))
        baselines = {
            name: stable((await finish(await start(name), workers)).messages)
            for name in CHAOS_SCRIPTS
        }
        names = [rng.choice(sorted(CHAOS_SCRIPTS)) for _ in range(CHAOS_TURNS)]
        turns = await asyncio.gather(*(start(name) for name in names))
        results = asyncio.ensure_future(
            asyncio.gather(*(asyncio.wait_for(t.result(), TURN_WITHIN) for t in turns))
        )
        # Kill a random worker every 1–4 s and start its replacement at once, until the turns
        # are done or 8 workers have died; then the survivors finish the job.
        while not results.done() and len(workers.killed) < 8:
            await asyncio.wait({results}, timeout=rng.uniform(1.0, 4.0))
            if results.done():
                break
            workers.kill(rng.choice(sorted(workers.running)))
            workers.start()
        if not workers.running:
            workers.start()
        try:
            finished = await results
        except TimeoutError:
            raise AssertionError(f"a turn did not finish; logs:\n{workers.log_tail()}") from None
        completed = [await completed_tool_calls(client, t.workflow_id) for t in turns]

    assert workers.killed  # the chaos did happen
    for name, turn, result, completed_at in zip(names, turns, finished, completed, strict=True):
        assert result.stop_reason == StopReason.END_TURN
        assert stable(result.messages) == baselines[name], turn.workflow_id
        expected = {cid for m in CHAOS_SCRIPTS[name][:-1] for cid in m["tool_calls"]}
        assert_once_or_retried_after_a_kill(
            record, turn.workflow_id, completed_at, workers.killed, expected
        )
