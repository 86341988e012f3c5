"""A turn as one step of a user's workflow (``turnkeep.in_workflow``): ``run_turn`` runs
``TurnWorkflow`` as a child and returns its result; cancelling the parent cancels the turn and
hands the parent the repaired conversation; ``start_turn`` returns the child's handle. The
parents (``tests.child_turn_workflows``) run on the same worker as the turns, as in an app
that adds ``TurnkeepPlugin`` to its own worker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import CancelledError
from temporalio.worker import Worker

from tests.child_turn_workflows import PARENTS, AskTwice, KeepsRepaired, Repaired, StartsTurn
from tests.conftest import Harness, eventually, make_settings
from tests.crafted_workflow import CraftedWorkflow
from tests.test_activity_checks import application_error
from turnkeep.client.turns import get_turn
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import RollbackState
from turnkeep.testing import harness as worker_harness
from turnkeep.workflows.child_turn import READ_CHILD_TURN
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio

gate = asyncio.Event()
started: list[str] = []


async def blocked(name: str) -> str:
    """Blocks until the test opens the gate (it never does: the turn is cancelled)."""
    started.append(name)
    await gate.wait()
    return f"{name} passed"


BLOCKED_CALL = '***CALL_TOOL local__blocked {"name": "slow"}'


@pytest.fixture
async def h(client: Client, tmp_path: Path) -> AsyncIterator[Harness]:
    """The app's worker: its own workflows, and turnkeep's by its plugin."""
    started.clear()
    settings = make_settings(
        tmp_path, agents={"test": {"model": "passthrough", "servers": ["local"]}}
    )
    async with worker_harness(
        client, settings, workflows=PARENTS, function_tools={"local": [blocked]}
    ) as worker:
        yield worker


async def run_parent(h: Harness, workflow: Any, *args: Any) -> Any:
    return await h.client.execute_workflow(
        workflow, args=list(args), id=f"parent-{uuid.uuid4().hex[:8]}", task_queue=h.task_queue
    )


async def child_ids(client: Client, parent_id: str) -> list[str]:
    """The child workflows ``parent_id`` started, from its history."""
    return [
        event.start_child_workflow_execution_initiated_event_attributes.workflow_id
        async for event in client.get_workflow_handle(parent_id).fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]


async def test_a_parent_runs_turns_as_steps(h: Harness) -> None:
    result = await run_parent(h, AskTwice.run, "first question", "second question")
    # The second turn continued the first's conversation: passthrough echoes each prompt.
    assert [m.text for m in result.history] == [
        "first question",
        "first question",
        "second question",
        "second question",
    ]
    assert result.stop_reason == StopReason.END_TURN


async def test_start_turn_returns_the_childs_handle(h: Harness) -> None:
    parent_id = f"parent-{uuid.uuid4().hex[:8]}"
    started_turn = await h.client.execute_workflow(
        StartsTurn.run, "hello", id=parent_id, task_queue=h.task_queue
    )
    assert started_turn.result.final.text == "hello"
    # Its id is the parent's with a suffix, and it is the parent's child, on the parent's queue.
    assert started_turn.child_id.startswith(f"{parent_id}/turn-test-")
    assert await child_ids(h.client, parent_id) == [started_turn.child_id]
    child = await h.client.get_workflow_handle(started_turn.child_id).describe()
    assert (child.parent_id, child.run_id) == (parent_id, started_turn.child_run_id)
    assert child.task_queue == h.task_queue


async def cancel_mid_tool(h: Harness, keep: bool) -> tuple[Any, str]:
    """Start ``KeepsRepaired`` on a turn that waits in a tool, cancel the parent once the tool
    runs; the parent's handle and its child's id."""
    parent = await h.client.start_workflow(
        KeepsRepaired.run,
        args=[BLOCKED_CALL, keep],
        id=f"parent-{uuid.uuid4().hex[:8]}",
        task_queue=h.task_queue,
    )
    await eventually(lambda: started, "the slow tool ran")
    await parent.cancel()
    [child_id] = await child_ids(h.client, parent.id)
    return parent, child_id


async def test_cancelling_the_parent_gives_it_the_repaired_conversation(h: Harness) -> None:
    parent, child_id = await cancel_mid_tool(h, keep=True)
    repaired: Repaired = await parent.result()
    # The turn was cancelled (not abandoned), and repaired as any cancelled turn is.
    child = h.client.get_workflow_handle(child_id)
    assert (await child.describe()).status == WorkflowExecutionStatus.CANCELED
    assert repaired.result is not None
    assert repaired.result.stop_reason == StopReason.CANCELLED
    assert repaired.result.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    [answer] = repaired.result.history[-1].tool_results.values()
    assert answer.is_error and answer.text == INTERRUPTED_TEXT
    assert repaired.result.history[-2].tool_calls
    # The very conversation a client reads from the cancelled turn.
    assert await get_turn(h.client, child_id).current() == repaired.result


async def test_a_parent_that_lets_the_cancellation_through_ends_cancelled(h: Harness) -> None:
    parent, _ = await cancel_mid_tool(h, keep=False)
    with pytest.raises(WorkflowFailureError) as failed:
        await parent.result()
    assert isinstance(failed.value.cause, CancelledError)
    assert (await parent.describe()).status == WorkflowExecutionStatus.CANCELED


async def test_read_child_turn_reads_only_the_callers_own_children(h: Harness) -> None:
    """Any workflow may schedule the activity: it refuses a turn the caller did not start."""
    parent_id = f"parent-{uuid.uuid4().hex[:8]}"
    started_turn = await h.client.execute_workflow(
        StartsTurn.run, "hello", id=parent_id, task_queue=h.task_queue
    )
    crafted_queue = f"crafted-{uuid.uuid4().hex[:10]}"
    async with Worker(h.client, task_queue=crafted_queue, workflows=[CraftedWorkflow]):
        for workflow_id in (started_turn.child_id, parent_id, "no-such-workflow"):
            with pytest.raises(WorkflowFailureError) as failed:
                await h.client.execute_workflow(
                    CraftedWorkflow.run,
                    args=[READ_CHILD_TURN, h.task_queue, {"workflow_id": workflow_id}],
                    id=f"crafted-{uuid.uuid4().hex[:8]}",
                    task_queue=crafted_queue,
                )
            error = application_error(failed.value)
            assert (error.type, error.non_retryable) == ("NotAChildTurn", True)
            assert repr(workflow_id) in error.message
