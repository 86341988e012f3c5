"""A turn as a child workflow of another workflow (``turnkeep.in_workflow.run_turn``, and the
turns of a ``SessionWorkflow``): starting it, awaiting its result, and what crosses to the
activity that reads a cancelled child turn's repaired conversation
(``turnkeep.activities.child_turn``).

A cancelled workflow closes with no result and no details, and a workflow cannot query
another, so the parent asks an activity to query the closed child."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import CancelledError, ChildWorkflowError

from turnkeep.contract.activity_io import Timeouts
from turnkeep.contract.messages import Message
from turnkeep.contract.turn_io import (
    NAME_MAX_CHARS,
    WORKFLOW_NAME,
    TurnCancelledError,
    TurnInput,
    TurnResult,
)
from turnkeep.workflows import actions, task_priority, visibility

READ_CHILD_TURN = "read_child_turn"


class ChildTurnRef(BaseModel):
    """A child turn of the calling workflow: the activity refuses any other."""

    # Temporal's own limit on a workflow id is 1,000 bytes; a bounded id keeps errors short.
    workflow_id: str = Field(min_length=1, max_length=5 * NAME_MAX_CHARS)


class ChildTurnState(BaseModel):
    # None for a turn cancelled before it had a plan (no conversation to repair yet).
    result: TurnResult | None


TurnChild = workflow.ChildWorkflowHandle[Any, TurnResult]
Result = TypeVar("Result")

# Querying a closed turn (a worker replays its history): quick, retried for a busy worker.
_READ = Timeouts(start_to_close=120.0, heartbeat=None, max_attempts=5)


async def start_turn_child(turn: TurnInput, *, id: str, task_queue: str | None) -> TurnChild:
    """Start ``turn`` as a child workflow with id ``id`` and return its handle once started."""
    return await start_child(turn, turn.messages[-1], TurnResult, id=id, task_queue=task_queue)


async def start_child(
    turn: TurnInput | RawValue,
    last: Message,
    result_type: type[Result],
    *,
    id: str,
    task_queue: str | None,
) -> workflow.ChildWorkflowHandle[Any, Result]:
    """Start a child turn from its input (or the payload of one: ``session_turns``), whose
    last message is ``last``, with its result decoded as ``result_type``."""
    return await workflow.start_child_workflow(
        WORKFLOW_NAME,
        turn,
        id=id,
        task_queue=task_queue,
        result_type=result_type,
        static_summary=visibility.prompt_summary(last.text) or None,
        priority=task_priority.current(),
        # The default, said here because child_turn_result relies on it: a cancelled parent
        # waits for the child to finish its repair, so the repaired conversation is in the
        # child's history.
        cancellation_type=workflow.ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
    )


async def turn_child_result(child: workflow.ChildWorkflowHandle[Any, Result]) -> Result:
    """The result of a child turn; raises ``TurnCancelledError`` with the repaired
    conversation (read by the ``read_child_turn`` activity) when it was cancelled."""
    try:
        return await child
    except ChildWorkflowError as err:
        if not isinstance(err.cause, CancelledError):
            raise
        read = await actions.execute(
            READ_CHILD_TURN,
            ChildTurnRef(workflow_id=child.id),
            ChildTurnState,
            visibility.clip(f"read cancelled turn {child.id}"),
            _READ,
        )
        raise TurnCancelledError(read.result) from err
