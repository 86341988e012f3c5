"""A user's own workflows that run turns as steps (``tests.test_child_turn``). They import
only temporalio and ``turnkeep.in_workflow``, as an app's workflows module would, and run in the
sandbox like any workflow of the app's."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import workflow

from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.in_workflow import TurnCancelledError, child_turn_result, run_turn, start_child_turn


@workflow.defn
class AskTwice:
    """Two turns in a row, the second continuing the first's conversation."""

    @workflow.run
    async def run(self, first: str, second: str) -> TurnResult:
        turn = await run_turn(TurnInput(agent="test", messages=[first]))
        return await run_turn(TurnInput(agent="test", messages=[second], history=turn.history))


class Repaired(BaseModel):
    result: TurnResult | None


@workflow.defn
class KeepsRepaired:
    """Runs one turn; when cancelled, catches the turn's cancellation and, with ``keep``,
    completes with the repaired conversation (else lets it through and ends cancelled)."""

    @workflow.run
    async def run(self, prompt: str, keep: bool) -> Repaired:
        try:
            await run_turn(TurnInput(agent="test", messages=[prompt]))
        except TurnCancelledError as cancelled:
            if not keep:
                raise
            return Repaired(result=cancelled.result)
        raise AssertionError("the test cancels this turn")


class Started(BaseModel):
    child_id: str
    child_run_id: str | None
    result: TurnResult


@workflow.defn
class StartsTurn:
    """``start_turn``'s handle, then its result."""

    @workflow.run
    async def run(self, prompt: str) -> Started:
        child = await start_child_turn(TurnInput(agent="test", messages=[prompt]))
        return Started(
            child_id=child.id,
            child_run_id=child.first_execution_run_id,
            result=await child_turn_result(child),
        )


PARENTS = [AskTwice, KeepsRepaired, StartsTurn]
