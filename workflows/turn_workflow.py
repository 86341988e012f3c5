"""``TurnWorkflow``: one agent turn as one Temporal workflow (SPEC §3, §4, §7).

The history of this workflow *is* the checkpoint: every model call and tool call is an
activity, so a worker that dies mid-turn is replaced by another that replays to the same point
and carries on without repeating what already completed.
"""

from __future__ import annotations

import asyncio

from pydantic import ValidationError
from temporalio import workflow

from workflows import actions
from workflows.loop import TurnState
from workflows.messages import CallToolResult, Message
from workflows.turn_io import TurnInput, TurnProgress, TurnResult

WORKFLOW_NAME = "TurnWorkflow"


# A malformed TurnInput fails the workflow with pydantic's explanation instead of failing its
# workflow task forever (which is what an input decoding error does by default).
@workflow.defn(name=WORKFLOW_NAME, failure_exception_types=[ValidationError])
class TurnWorkflow:
    def __init__(self) -> None:
        self._state: TurnState | None = None
        # Results of the current tool batch as they arrive, so a cancellation keeps them.
        self._completed: dict[str, CallToolResult] = {}

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnResult:
        plan = await actions.prepare_turn(turn)
        state = self._state = TurnState.start(turn, plan)
        try:
            state.tools = await actions.list_tools(plan)
            while not state.done:
                self._show(f"waiting on model `{plan.model}`")
                state.on_assistant(await actions.call_model(state.model_request(), plan))
                if state.awaiting_tools:
                    batch = state.tool_batch()
                    self._show("running " + ", ".join(f"`{c.name}`" for c in batch.to_run))
                    self._completed = {}
                    results, timing = await actions.run_tools(batch, plan, self._completed)
                    state.on_tool_results(results, timing)
        except asyncio.CancelledError:
            state.cancel(completed=self._completed)
            self._show("cancelled")
            raise
        self._show("done")
        # Let long-polling watchers see the end before the run closes.
        await workflow.wait_condition(workflow.all_handlers_finished)
        return state.result()

    @workflow.update
    async def wait_for_messages(self, after: int) -> TurnProgress:
        """Long-poll: returns once the turn has more than ``after`` messages, or has ended."""
        await workflow.wait_condition(
            lambda: self._progress().count > after or self._progress().done
        )
        return self._progress()

    @workflow.query
    def transcript(self, start: int = 0) -> list[Message]:
        """``TurnResult.messages[start:]`` as they stand."""
        return self._state.messages[start:] if self._state else []

    @workflow.query
    def turn(self) -> TurnResult | None:
        """The turn as it stands; after a cancellation, the repaired conversation."""
        return self._state.result() if self._state else None

    def _progress(self) -> TurnProgress:
        state = self._state
        return TurnProgress(
            count=len(state.messages) if state else 0, done=bool(state and state.done)
        )

    def _show(self, doing: str) -> None:
        """Current details for the Web UI: where the turn is, in one glance."""
        state = self._state
        if state is None:
            return
        tokens_in = sum(u.input_tokens for u in state.usage.values())
        tokens_out = sum(u.output_tokens for u in state.usage.values())
        workflow.set_current_details(
            f"**{state.plan.agent}** · iteration {state.iteration} · {doing}\n\n"
            f"model calls: {state.model_calls} · tokens in/out: {tokens_in}/{tokens_out}"
            + (f" · last stop: `{state.stop_reason}`" if state.stop_reason else "")
        )
