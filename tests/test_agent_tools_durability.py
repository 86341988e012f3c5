"""Agents as tools survive what a turn survives: a worker SIGKILLed while a child turn's tool
runs, and a parent that continues as new around its children.

- Kill: the worker process (``turnkeep worker``, serving the parent's queue and the child
  agent's) dies while the child's MCP tool sleeps. A new worker takes over: the child retries
  that tool and completes, the parent completes with the child's answer as the call's result,
  and neither the parent's model call nor the start of the child was made again.
- Continue-as-new: with ``history_events: 1`` every step's end cuts the run, so the parent's
  request for agent calls ends one run and the next one starts the children; children that run
  a tool continue as new themselves. Every child's answer comes back, across several runs, and
  each child is started once, under the id its call gives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus

from tests.conftest import eventually, make_settings, write_script
from tests.test_continue_as_new import chain
from tests.test_durability import FAST_RECOVERY, TOOL, starts
from tests.worker_process import WorkerProcesses, effects_server, write_config
from turnkeep.activities.tools import idempotency_key
from turnkeep.client.turns import start_turn
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import TurnInput, agent_task_queue
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing import harness as worker_harness
from turnkeep.workflows.agent_tools import child_id

pytestmark = pytest.mark.asyncio

TURN_WITHIN = 120.0  # seconds a turn may take to finish, the kill included
SLOW_SECONDS = 3.0  # the child's tool: long enough to be killed in


def ask(agent: str, message: str) -> str:
    """A parent prompt that makes the passthrough model call ``agent`` with ``message``."""
    return f"***CALL_TOOL agent__{agent} {json.dumps({'message': message})}"


def scheduled(events: list[HistoryEvent]) -> list[str]:
    """What the run did, in order: each activity it scheduled (a local one as ``local
    <type>``, once it completed) and each child it started."""
    out = []
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            out.append(event.activity_task_scheduled_event_attributes.activity_type.name)
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_local_activity":
                data = json.loads(marker.details["data"].payloads[0].data)
                out.append(f"local {data['activity_type']}")
        elif event.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            out.append(
                "child "
                + event.start_child_workflow_execution_initiated_event_attributes.workflow_id
            )
    return out


async def history(client: Client, workflow_id: str) -> list[HistoryEvent]:
    return [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]


# --- a worker killed mid-child ---------------------------------------------------------------


@pytest.fixture
async def workers(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> AsyncIterator[tuple[WorkerProcesses, str, Path]]:
    with team_workers(temporal, tmp_path) as processes:
        yield processes


@contextlib.contextmanager
def team_workers(
    temporal: ServerInfo, tmp_path: Path, **helper: Any
) -> Iterator[tuple[WorkerProcesses, str, Path]]:
    """Worker processes for a ``boss`` that calls a ``helper`` (with ``helper`` settings added)
    whose tool logs its runs to the record: the processes, their task queue, the record."""
    record = tmp_path / "record.jsonl"
    task_queue = f"team-{uuid.uuid4().hex[:10]}"
    agents = {
        "boss": {"model": "passthrough", "agents": ["helper"], "llm_timeouts": FAST_RECOVERY},
        "helper": {
            "model": "passthrough",
            "servers": ["effects"],
            "llm_timeouts": FAST_RECOVERY,
            "tool_timeouts": FAST_RECOVERY,
            **helper,
        },
    }
    config = {
        "task_queue": task_queue,
        "mcp": {"servers": {"effects": effects_server(record)}},
        "agents": agents,
    }
    path = write_config(tmp_path / "turnkeep.yaml", config)
    with WorkerProcesses(path, temporal.address, tmp_path / "logs") as processes:
        yield processes, task_queue, record


async def serving(client: Client, processes: WorkerProcesses, task_queue: str) -> int:
    """A new worker process, once it polls the parent's queue and the child agent's."""
    pid = processes.start()
    for queue in (task_queue, agent_task_queue(task_queue, "helper")):
        await processes.wait_polling(client, queue, pid)
    return pid


@pytest.mark.slow  # worker processes of its own, one of them killed
async def test_a_worker_killed_while_a_child_turns_tool_runs(
    client: Client, workers: tuple[WorkerProcesses, str, Path]
) -> None:
    processes, task_queue, record = workers
    first = await serving(client, processes, task_queue)
    slow = json.dumps({"tag": "slow", "seconds": SLOW_SECONDS})
    turn = await start_turn(
        client,
        TurnInput(agent="boss", messages=[ask("helper", f"***CALL_TOOL {TOOL} {slow}")]),
        task_queue=task_queue,
    )
    child = child_id(turn.workflow_id, 1, "call_1_1")
    await eventually(lambda: starts(record, child, "call_1_1"), "the child's tool is running")
    processes.kill(first)
    second = await serving(client, processes, task_queue)
    try:
        result = await asyncio.wait_for(turn.result(), TURN_WITHIN)
    except TimeoutError:
        raise AssertionError(f"the turn did not finish:\n{processes.log_tail()}") from None

    # The parent ends with the child's answer as the agent call's result.
    assert result.stop_reason == StopReason.END_TURN
    [(call_id, tool_result)] = list((result.messages[2].tool_results or {}).items())
    assert call_id == "call_1_1"
    assert not tool_result.is_error and tool_result.text == "slow done"
    assert result.final is not None and result.final.text == "slow done"

    # The parent was not re-run: its first model call, then the child, each scheduled once.
    # (A parent with agent tools only has no tools to list.)
    assert scheduled(await history(client, turn.workflow_id)) == [
        "prepare_turn",
        "llm_step",
        f"child {child}",
        "llm_step",
    ]
    # The child resumed where it was: its model call was not made again, its tool was
    # retried (the attempt in flight at the kill, then one in the new worker).
    described = await client.get_workflow_handle(child).describe()
    assert described.status == WorkflowExecutionStatus.COMPLETED
    assert described.parent_id == turn.workflow_id
    # A called agent's turn prepares in its first workflow task (a local activity).
    assert scheduled(await history(client, child)) == [
        "local prepare_turn",
        "list_tools",
        "llm_step",
        "call_tool",
        "llm_step",
    ]
    runs = starts(record, child, "call_1_1")
    assert [r["worker"] for r in runs] == [first, second]
    assert {r["key"] for r in runs} == {idempotency_key(child, "call_1_1")}


# --- continue-as-new around children ----------------------------------------------------------


def quick(name: str) -> str:
    return f"{name} done"


def agent_calls(*messages: tuple[str, str]) -> dict[str, Any]:
    """A scripted parent answer calling the ``helper`` agent, one call per (id, message)."""
    return {
        "tool_calls": {
            call_id: {"name": "agent__helper", "arguments": {"message": message}}
            for call_id, message in messages
        }
    }


async def test_a_parent_continues_as_new_around_its_children(
    client: Client, tmp_path: Path
) -> None:
    tool_line = '***CALL_TOOL local__quick {"name": "%s"}'
    script = write_script(
        tmp_path / "boss.json",
        agent_calls(("a1", "first"), ("a2", tool_line % "second")),
        agent_calls(("b1", tool_line % "third")),
        "all reported",
    )
    agents = {
        "boss": {"model": "playback", "playback": str(script), "agents": ["helper"]},
        "helper": {"model": "passthrough", "servers": ["local"]},
    }
    # Every step's end cuts the run: the parent's, and a child's that runs a tool.
    settings = make_settings(tmp_path, agents=agents, continue_as_new={"history_events": 1})
    async with worker_harness(
        client, settings, function_tools={"local": [quick]}, default_agent="boss"
    ) as h:
        turn = await h.start("go")
        result = await asyncio.wait_for(turn.result(), TURN_WITHIN)
    runs = await chain(client, turn.workflow_id)

    assert result.stop_reason == StopReason.END_TURN
    answers = [
        {cid: r.text for cid, r in m.tool_results.items()}
        for m in result.messages
        if m.tool_results
    ]
    assert answers == [{"a1": "first", "a2": "second done"}, {"b1": "third done"}]
    assert result.final is not None and result.final.text == "all reported"

    # One step per run: each model call's request ends a run, the next starts its children
    # (under the ids the call gives them), and each child is started exactly once.
    ids = {c: child_id(turn.workflow_id, n, c) for n, c in [(1, "a1"), (1, "a2"), (2, "b1")]}
    assert [scheduled(r.events) for r in runs] == [
        ["prepare_turn", "llm_step"],
        [f"child {ids['a1']}", f"child {ids['a2']}"],
        ["llm_step"],
        [f"child {ids['b1']}"],
        ["llm_step"],
    ]
    cut = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    assert [r.ended for r in runs[:-1]] == [cut] * (len(runs) - 1)
    # Children that ran a tool continued as new themselves; the parent got their last run's
    # answer all the same.
    for call_id, expected_runs in (("a1", 1), ("a2", 3), ("b1", 3)):
        child_runs = await chain(client, ids[call_id])
        assert len(child_runs) == expected_runs, call_id
        assert child_runs[-1].ended == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
