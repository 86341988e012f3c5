"""A turn as one step of your own workflow: ``run_turn`` runs ``TurnWorkflow`` as a child
workflow and returns its ``TurnResult``.

```python
from temporalio import workflow
from turnkeep import TurnInput
from turnkeep.in_workflow import run_turn

@workflow.defn
class Research:
    @workflow.run
    async def run(self, question: str) -> str:
        result = await run_turn(TurnInput(agent="researcher", messages=[question]))
        return result.final.text if result.final else ""
```

Workflow code only: it imports nothing but ``temporalio.workflow`` and turnkeep's workflow
code, so it runs inside Temporal's sandbox. The worker that runs the child needs
``TurnkeepPlugin`` (it registers ``TurnWorkflow`` and its activities); by default that is the
parent's own worker, as the child goes to the parent's task queue.

Cancelling the parent cancels the turn: the child repairs its conversation (an interrupted
tool call gets its "interrupted" result, as for any cancelled turn), and ``run_turn`` raises
``TurnCancelledError`` with that repaired ``TurnResult`` as ``result``, which the
``read_child_turn`` activity asks the closed child for. Let it through and the parent ends
cancelled too; catch it to carry on (say, to record the conversation) before ending.
"""

from __future__ import annotations

from temporalio import workflow

from turnkeep.contract.turn_io import TurnCancelledError, TurnInput, TurnResult
from turnkeep.workflows.child_turn import TurnChild, start_turn_child, turn_child_result

__all__ = ["TurnCancelledError", "child_turn_result", "run_turn", "start_child_turn"]


async def run_turn(
    turn: TurnInput, *, task_queue: str | None = None, id: str | None = None
) -> TurnResult:
    """Run ``turn`` as a child workflow of the calling workflow and return its result.

    ``task_queue``: where turnkeep's worker polls; the parent's by default. ``id``: the child's
    workflow id; by default the parent's id with a suffix (``start_child_turn``). Raises
    ``TurnCancelledError`` (with the repaired conversation) when the turn is cancelled, and
    Temporal's ``ChildWorkflowError`` when it fails (an unknown agent, say)."""
    return await child_turn_result(await start_child_turn(turn, task_queue=task_queue, id=id))


async def start_child_turn(
    turn: TurnInput, *, task_queue: str | None = None, id: str | None = None
) -> TurnChild:
    """Start ``turn`` as a child workflow and return its handle once the child has started;
    ``await child_turn_result(handle)`` for its result (awaiting the handle itself gives a bare
    ``ChildWorkflowError`` for a cancelled turn, without the repaired conversation).

    The default id is ``<parent id>/turn-<agent>-<8 hex digits>``, the digits from the
    workflow's seeded random numbers: the same on replay, new for every turn the parent runs."""
    default_id = f"{workflow.info().workflow_id}/turn-{turn.agent}-{workflow.uuid4().hex[:8]}"
    return await start_turn_child(turn, id=id or default_id, task_queue=task_queue)


async def child_turn_result(child: TurnChild) -> TurnResult:
    """The result of a turn started with ``start_child_turn``; raises ``TurnCancelledError`` with
    the repaired conversation when it was cancelled."""
    return await turn_child_result(child)
