"""The ``read_child_turn`` activity: the repaired conversation of a turn that a parent workflow
ran with ``turnkeep.in_workflow.run_turn`` and that was cancelled.

A cancelled workflow closes with no result, and a workflow cannot query another, so the
parent's ``run_turn`` schedules this to ask the closed child its ``turn`` query, which a
worker on the child's task queue answers by replaying its history."""

from __future__ import annotations

from temporalio import activity
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.errors import config_error, require_workflow
from turnkeep.workflows.child_turn import READ_CHILD_TURN, ChildTurnRef, ChildTurnState
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME, TurnWorkflow


@activity.defn(name=READ_CHILD_TURN)
async def read_child_turn(ref: ChildTurnRef) -> ChildTurnState:
    require_workflow()
    parent = activity.info().workflow_id
    child = activity.client().get_workflow_handle(ref.workflow_id)
    # Any client may schedule this with any workflow id: it reads only a turn that is a child
    # of the workflow asking, which that workflow started and so may read.
    try:
        described = await child.describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        described = None
    if described is None or (described.workflow_type, described.parent_id) != (
        WORKFLOW_NAME,
        parent,
    ):
        raise config_error(
            "NotAChildTurn",
            f"workflow {ref.workflow_id!r} is not a turn started by this workflow "
            f"({parent!r}); read_child_turn reads only those",
        )
    return ChildTurnState(result=await child.query(TurnWorkflow.turn))
