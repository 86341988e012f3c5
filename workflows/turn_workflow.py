"""``TurnWorkflow``: one agent turn as one Temporal workflow (SPEC §3, §4, §7).

The history of this workflow *is* the checkpoint: every model call and tool call is an
activity, so a worker that dies mid-turn is replaced by another that replays to the same point
and carries on without repeating what already completed.
"""

from __future__ import annotations

import asyncio

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import actions
from workflows.activity_io import (
    MODEL_INPUT_QUERY,
    HookPoint,
    LlmRequest,
    ModelInputPage,
    model_input_page,
)
from workflows.loop import TurnState
from workflows.messages import CallToolResult, Message
from workflows.turn_io import TurnInput, TurnProgress, TurnResult

WORKFLOW_NAME = "TurnWorkflow"

# As in fast-agent: a failing after_tool_call (or after_turn_complete, once the answer stands)
# is logged and ignored; any other hook failing ends the turn with an `error` message.
_HOOKS_THAT_MAY_FAIL = (HookPoint.AFTER_TOOL_CALL, HookPoint.AFTER_TURN_COMPLETE)


# A malformed TurnInput fails the workflow with pydantic's explanation instead of failing its
# workflow task forever (which is what an input decoding error does by default).
@workflow.defn(name=WORKFLOW_NAME, failure_exception_types=[ValidationError])
class TurnWorkflow:
    def __init__(self) -> None:
        self._state: TurnState | None = None
        # Results of the current tool batch as they arrive, so a cancellation keeps them.
        self._completed: dict[str, CallToolResult] = {}
        # The request of the model call in flight, which `llm_step` reads by query.
        self._model_input: LlmRequest | None = None

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnResult:
        plan = await actions.prepare_turn(turn)
        state = self._state = TurnState.start(turn, plan)
        try:
            state.tools = await actions.list_tools(plan)
            while not state.done:
                await self._maybe_compact()
                await self._hooks(HookPoint.BEFORE_LLM_CALL)
                if not state.done:
                    await self._ask_model()
                if state.awaiting_tools:
                    await self._hooks(HookPoint.BEFORE_TOOL_CALL)
                if state.awaiting_tools:
                    await self._run_tools()
        except asyncio.CancelledError:
            # fast-agent's interrupted-tool repair; after_turn_complete never runs here.
            state.cancel(completed=self._completed)
            self._show("cancelled")
            await self._release_watchers()
            raise
        await self._hooks(HookPoint.AFTER_TURN_COMPLETE)
        self._show("done")
        await self._release_watchers()
        return state.result()

    async def _release_watchers(self) -> None:
        # Long-polling watchers see the end (state.done) before the run closes.
        await workflow.wait_condition(workflow.all_handlers_finished)

    async def _ask_model(self) -> None:
        state = self._require_state()
        self._show(f"waiting on model `{state.plan.model}`")
        self._model_input = state.model_request()
        state.on_assistant(await actions.call_model(self._model_input, state.plan))
        await self._hooks(HookPoint.AFTER_LLM_CALL)

    async def _run_tools(self) -> None:
        state = self._require_state()
        batch = state.tool_batch()
        self._show("running " + ", ".join(f"`{c.name}`" for c in batch.to_run))
        self._completed = {}
        results, timing = await actions.run_tools(batch, state.plan, self._completed)
        state.on_tool_results(results, timing)
        await self._hooks(HookPoint.AFTER_TOOL_CALL)

    async def _maybe_compact(self) -> None:
        """Summarise older exchanges when the context is near full; never breaks the loop."""
        state = self._require_state()
        cut = state.compaction_cut()
        if cut is None:
            return
        self._show("compacting history")
        try:
            summary = await actions.compact_history(state.conversation()[:cut], state.plan)
        except ActivityError as err:
            workflow.logger.warning("compaction failed, history unchanged: %s", err)
            state.compaction_failed = True
            return
        state.on_compacted(cut, summary)

    async def _hooks(self, point: HookPoint) -> None:
        """Run the agent's hooks for ``point`` as activities; none configured, none run."""
        state = self._require_state()
        for hook in state.plan.hooks.get(point, []):
            try:
                change = await actions.run_hook(hook, state.hook_context(point))
            except ActivityError as err:
                text = f"Hook '{hook}' ({point}) failed: {actions.failure_text(err)}"
                if point in _HOOKS_THAT_MAY_FAIL:
                    workflow.logger.warning("%s (ignored)", text)
                    continue
                state.fail(text)
                return
            state.on_hook(hook, change)

    def _require_state(self) -> TurnState:
        assert self._state is not None, "the loop runs only after prepare_turn"
        return self._state

    @workflow.update
    async def wait_for_messages(self, after: int) -> TurnProgress:
        """Long-poll: returns once the turn has more than ``after`` messages, or has ended."""
        await workflow.wait_condition(
            lambda: self._progress().count > after or self._progress().done
        )
        return self._progress()

    @workflow.query(name=MODEL_INPUT_QUERY)
    def model_input(self, call_index: int, start: int = 0) -> ModelInputPage | None:
        """A page of the request of model call ``call_index``, while it is in flight."""
        request = self._model_input
        if request is None or request.call_index != call_index:
            return None
        return model_input_page(request, start)

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
