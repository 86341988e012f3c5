"""A tool call awaiting approval survives real crashes (issue 23, Proof): the worker process
SIGKILLed while the call waits, and the Temporal dev server SIGKILLed and restarted on its
SQLite file while it waits. Workers run as separate OS processes (``tests.worker_process``),
the model is the fake Anthropic API (so the test sees what the model was sent), and the tool is
the effect server of ``tests.test_durability``, which logs every execution across processes.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from tests.conftest import eventually
from tests.test_durability import TOOL, Fleet, agent, assert_ran, executions, worker_config
from tests.worker_process import WorkerProcesses
from turnkeep.client.connection import connect
from turnkeep.client.turns import TurnHandle
from turnkeep.contract.approval import PendingCall
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.workflows import visibility

# Servers and worker processes of its own, killed on purpose: slow, and marked so.
pytestmark = [pytest.mark.asyncio, pytest.mark.server, pytest.mark.slow]

ASK = Reply.tool_calls(("c1", TOOL, {"tag": "gated"}))
DONE = Reply.text("all done")


def gated_config(directory: Path, task_queue: str, fake: FakeModelApi) -> Path:
    """An agent on the fake Anthropic API whose every effect call waits for approval (an hour:
    no timeout fires during a test)."""
    gated = agent({"model": "anthropic.test-model"})
    gated["approval"] = {"tools": ["effects__*"], "timeout": "1h"}
    anthropic = {"api_key": "sk-test", "base_url": fake.base_url_anthropic}
    record = directory / "record.jsonl"
    return worker_config(directory, task_queue, record, {"gated": gated}, anthropic=anthropic)


async def still_waiting(turn: TurnHandle) -> list[PendingCall] | None:
    """The turn's waiting calls, or None while no worker can answer the query yet (a server
    coming back, a new worker replaying)."""
    try:
        return await turn.pending_approvals()
    except RPCError:
        return None


async def status(turn: TurnHandle) -> str | None:
    described = await turn.handle.describe()
    return described.typed_search_attributes.get(visibility.STATUS)


def tool_results_sent(fake: FakeModelApi) -> list[dict[str, object]]:
    """The tool_result blocks of the last request the model was sent."""
    return [
        block
        for message in fake.requests[-1].body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


async def test_worker_killed_while_a_call_awaits_approval(
    client: Client, temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    task_queue = f"approval-{uuid.uuid4().hex[:10]}"
    fake.script(ASK, DONE, api="anthropic")
    config = gated_config(tmp_path, task_queue, fake)
    record = tmp_path / "record.jsonl"
    with WorkerProcesses(config, temporal.address, tmp_path / "logs") as workers:
        fleet = Fleet(client, workers, task_queue, record)
        first = await fleet.single()
        turn = await fleet.start("gated")
        [pending] = await eventually(lambda: still_waiting(turn), "c1 awaits approval")
        assert pending.call_id == "c1"
        workers.kill(first)
        second = await workers.start_polling(client, task_queue)
        # The new worker replays the turn to the same wait: the call is still pending, not run.
        [pending] = await eventually(lambda: still_waiting(turn), "c1 still awaits approval")
        assert pending.call_id == "c1" and not executions(record, turn.workflow_id)
        decided = await turn.decide("c1", True, by="alice")
        result = await fleet.finish(turn)

    assert decided.decision == "approve"
    assert [(d.call_id, d.by) for d in result.decisions] == [("c1", "alice")]
    answer = next(m.tool_results["c1"] for m in result.messages if m.tool_results)
    assert not answer.is_error and answer.text == "gated done"
    assert result.final is not None and result.final.text == "all done"
    # Exactly once, and by the worker that received the approval: the killed one never ran it.
    assert_ran(record, turn.workflow_id, {"c1"}, once={"c1"})
    assert [e["worker"] for e in executions(record, turn.workflow_id)["c1"]] == [second] * 3
    assert len(fake.requests) == 2


async def test_server_restarted_while_a_call_awaits_approval(
    fake: FakeModelApi, tmp_path: Path
) -> None:
    server = EmbeddedServer(db_file=tmp_path / "temporal.db", ui=False)
    info = await server.start()
    try:
        client = await connect(info.address, info.namespace)
        task_queue = f"approval-{uuid.uuid4().hex[:10]}"
        fake.script(ASK, DONE, api="anthropic")
        config = gated_config(tmp_path, task_queue, fake)
        record = tmp_path / "record.jsonl"
        with WorkerProcesses(config, info.address, tmp_path / "logs") as workers:
            fleet = Fleet(client, workers, task_queue, record)
            worker = await fleet.single()
            turn = await fleet.start("gated")
            await eventually(lambda: still_waiting(turn), "c1 awaits approval")
            server.kill()
            await server.start()  # same port, same SQLite file
            [pending] = await eventually(lambda: still_waiting(turn), "c1 awaits approval again")
            waiting_status = await status(turn)
            await turn.decide("c1", False, reason="not today", by="carol")
            result = await fleet.finish(turn)
            worker_survived = worker in workers.running and workers.running[worker].poll() is None
    finally:
        await server.stop()

    assert pending.call_id == "c1" and pending.arguments == {"tag": "gated"}
    assert waiting_status == "AwaitingApproval"
    assert worker_survived  # the same worker picked the wait up again after the outage
    # The model's next request carried the denial as an error result, and the tool never ran.
    [sent] = tool_results_sent(fake)
    assert sent["tool_use_id"] == "c1" and sent.get("is_error") is True
    assert "Tool call denied by carol: not today" in json.dumps(sent["content"])
    assert not executions(record, turn.workflow_id)
    assert [(d.decision, d.by) for d in result.decisions] == [("deny", "carol")]
    assert result.final is not None and result.final.text == "all done"
