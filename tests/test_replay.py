"""Determinism guard: turn histories replay against the current workflow code.

The histories beside this module (``HISTORIES``) were recorded from representative turns by an
earlier version of the code; replaying them here makes an unguarded change to
``turnkeep.workflows`` fail CI. Refresh them by running this module with
``TURNKEEP_RECORD_HISTORIES=1`` only once the old path a guarded change kept is gone (the design
notes' *Changing the workflow safely*).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from tests.conftest import HarnessFactory, eventually, write_script
from turnkeep import open_session
from turnkeep.client.turns import TurnHandle
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import RollbackState, TurnCancelledError
from turnkeep.testing import check_replay
from turnkeep.testing.fake_api import FakeModelApi, Reply

pytestmark = pytest.mark.asyncio

HISTORIES = Path(__file__).with_name("histories")
RECORD = os.environ.get("TURNKEEP_RECORD_HISTORIES") == "1"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def scripted(*specs: tuple[str, int, int]) -> dict[str, Any]:
    calls = {cid: {"name": "local__add", "arguments": {"a": a, "b": b}} for cid, a, b in specs}
    return {"tool_calls": calls}


SCENARIOS: dict[str, tuple[list[Any], dict[str, Any]]] = {
    "plain": (["Just text."], {}),
    "parallel_tools": (
        [scripted(("c1", 1, 2), ("c2", 3, 4)), scripted(("c3", 5, 6)), "Sums: 3, 7, 11."],
        {},
    ),
    "max_iterations": ([scripted((f"c{i}", i, i)) for i in range(5)], {"max_iterations": 1}),
    "structured_output": (
        [scripted(("c1", 2, 2)), "It is four.", '{"answer": 4}'],
        {"structured_output": {"type": "object"}},
    ),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_scenario_replays_fresh_and_recorded(
    name: str, harness: HarnessFactory, tmp_path: Path
) -> None:
    script, overrides = SCENARIOS[name]
    path = write_script(tmp_path / "script.json", *script)
    agent = {"model": "playback", "playback": str(path), "servers": ["local"]}
    config = {"agents": {"test": {**agent, "overrides": sorted(overrides)}}}
    async with harness({"local": [add]}, **config) as h:
        handle = await h.start("go", **overrides)
        await handle.result()
        fresh = await handle.handle.fetch_history()
    await replays_fresh_and_recorded(name, fresh)


async def replays_fresh_and_recorded(
    name: str, fresh: WorkflowHistory, workflow_id: str | None = None
) -> None:
    """``workflow_id``: the id the recorded history had, for a workflow whose commands name
    it (a session's child turns)."""
    # The strict sandbox: a forbidden call anywhere in workflow code fails here.
    await check_replay([fresh])

    recorded = HISTORIES / f"{name}.json"
    if RECORD:
        HISTORIES.mkdir(exist_ok=True)
        recorded.write_text(fresh.to_json(), encoding="utf-8")
    assert recorded.exists(), (
        f"no recorded history for {name}; record with TURNKEEP_RECORD_HISTORIES=1"
    )
    old = WorkflowHistory.from_json(
        workflow_id or f"recorded-{name}", recorded.read_text(encoding="utf-8")
    )
    await check_replay([old])


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelApi]:
    with FakeModelApi() as provider:
        yield provider


async def test_error_replays_fresh_and_recorded(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    """A tool round, then a model call that fails for good: the turn ends with `error`."""
    fake.reset()
    fake.script(
        Reply.tool_calls(("c1", "local__add", {"a": 1, "b": 2})),
        Reply.error(400, "bad request"),
        api="anthropic",
    )
    config = {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "agents": {"test": {"model": "anthropic.test-model", "servers": ["local"]}},
    }
    async with harness({"local": [add]}, **config) as h:
        handle = await h.start("go")
        result = await handle.result()
        fresh = await handle.handle.fetch_history()
    assert result.stop_reason == StopReason.ERROR  # the scenario is what its name says
    await replays_fresh_and_recorded("error", fresh)


gate = asyncio.Event()


async def wait_for_gate(name: str) -> str:
    """Blocks until the test opens the gate."""
    await gate.wait()
    return name


async def test_cancelled_replays_fresh_and_recorded(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    """Cancelled while parallel tools run, one of them done: the repaired, Canceled turn."""
    gate.clear()
    calls = {
        "c1": {"name": "local__add", "arguments": {"a": 1, "b": 2}},
        "c2": {"name": "local__wait_for_gate", "arguments": {"name": "g"}},
    }
    path = write_script(tmp_path / "script.json", {"tool_calls": calls}, "never")
    agent = {"model": "playback", "playback": str(path), "servers": ["local"]}
    async with harness({"local": [add, wait_for_gate]}, agents={"test": agent}) as h:
        handle = await h.start("go")
        async for message in handle.messages(include_tool_results=True):
            if message.tool_calls:
                break
        await eventually(lambda: _add_completed(handle))
        await handle.cancel()
        with pytest.raises(TurnCancelledError) as cancelled:
            await handle.result()
        fresh = await handle.handle.fetch_history()
    gate.set()
    repaired = cancelled.value.result
    assert repaired is not None and repaired.stop_reason == StopReason.CANCELLED
    assert repaired.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    await replays_fresh_and_recorded("cancelled", fresh)


async def _add_completed(handle: TurnHandle) -> bool:
    completed = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    events = [e async for e in handle.handle.fetch_history_events()]
    return sum(e.event_type == completed for e in events) >= 4  # prepare, list, llm, add


async def test_approval_replays_fresh_and_recorded(harness: HarnessFactory, tmp_path: Path) -> None:
    """A batch with a gated call and an ungated one: the ungated runs, the gated waits for a
    person, who approves it with edited arguments."""
    path = write_script(
        tmp_path / "script.json",
        {
            "tool_calls": {
                "w1": {"name": "local__add", "arguments": {"a": 1, "b": 1}},
                "r1": {"name": "local__wait_for_gate", "arguments": {"name": "open"}},
            }
        },
        "Done.",
    )
    gate.set()
    agent = {
        "model": "playback",
        "playback": str(path),
        "servers": ["local"],
        "approval": {"tools": ["local__add"], "timeout": "1d"},
    }
    async with harness({"local": [add, wait_for_gate]}, agents={"test": agent}) as h:
        handle = await h.start("go")
        await eventually(handle.pending_approvals, "the call awaits approval")
        await handle.decide("w1", True, by="tester", arguments={"a": 2, "b": 2})
        result = await handle.result()
        fresh = await handle.handle.fetch_history()
    [decision] = result.decisions
    assert decision.arguments == {"a": 2, "b": 2}
    await replays_fresh_and_recorded("approval", fresh)


async def test_session_replays_fresh_and_recorded(harness: HarnessFactory, tmp_path: Path) -> None:
    """A session's first run: two turns, then it continues as new."""
    path = write_script(tmp_path / "script.json", "One.", "Two.", "Three.")
    agent = {"model": "playback", "playback": str(path)}
    # Its child turns' ids derive from its own: the recorded one replays under the same id.
    session_id = "replayed-session"
    async with harness(agents={"test": agent}) as h:
        session = await open_session(
            h.client, agent="test", task_queue=h.task_queue, session_id=session_id, turns_per_run=2
        )
        first_run = (await session.handle.describe()).run_id
        for n in (1, 2, 3):
            sent = await session.send(f"message {n}")
            async for _ in session.messages(2 * (n - 1), until_turn=sent.turn):
                pass
        first = h.client.get_workflow_handle(session_id, run_id=first_run)
        fresh = await first.fetch_history()
        await session.close()
        await session.result()
    assert fresh.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    await replays_fresh_and_recorded("session", fresh, session_id)


async def test_inline_agent_call_replays_fresh_and_recorded(harness: HarnessFactory) -> None:
    """A call of an agent whose config says `call: inline`: its plan, its model calls and its
    own tool call are steps of the calling turn's history, between the caller's two model
    calls."""
    agents = {
        "test": {"model": "passthrough", "agents": ["helper"]},
        "helper": {"model": "passthrough", "servers": ["local"], "call": "inline"},
    }
    inner = '***CALL_TOOL local__add {"a": 1, "b": 2}'
    prompt = f"***CALL_TOOL agent__helper {json.dumps({'message': inner})}"
    async with harness({"local": [add]}, agents=agents) as h:
        handle = await h.start(prompt)
        result = await handle.result()
        fresh = await handle.handle.fetch_history()
    [tool_result] = (result.messages[2].tool_results or {}).values()
    assert tool_result.text == "3" and set(result.usage_by_agent) == {"test", "helper"}
    await replays_fresh_and_recorded("inline_agent", fresh)
