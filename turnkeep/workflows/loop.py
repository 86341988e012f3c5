"""Loop *control* for one turn: when to call the model, which tool calls to run, when to stop.

Pure and synchronous — no Temporal, no I/O — so every rule of the turn loop (the
documentation's *The turn loop*) is testable without a server. ``TurnWorkflow`` owns the *actions*
(model and tool activities) and feeds their results back here; this is fast-agent's ``ToolRunner``
with the agent callbacks taken out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from turnkeep.contract.activity_io import (
    HookChange,
    HookContext,
    HookPoint,
    ToolCallRequest,
    ToolSpec,
    TurnPlan,
)
from turnkeep.contract.approval import AllowRule, DecisionRecord, PendingCall
from turnkeep.contract.conversation import ConversationRef, after_turn
from turnkeep.contract.messages import (
    CallToolResult,
    Message,
    StopReason,
    TextContent,
    estimate_tokens,
    json_channel,
)
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.server_requests import ServerAnswer, ServerRequest
from turnkeep.contract.turn_io import (
    HistoryChange,
    RollbackState,
    Spent,
    TurnInput,
    TurnResult,
    Usage,
)
from turnkeep.workflows import budget_math
from turnkeep.workflows.repair import repair_dangling_tool_calls
from turnkeep.workflows.tool_batch import ToolBatch

SUMMARY_PREFIX = "Summary of the earlier conversation:\n\n"
STRUCTURED_FINALIZATION_PROMPT = (
    "Now produce the final answer as structured JSON matching the requested schema. "
    "Do not call any tools."
)


class TurnState(BaseModel):
    """Everything the loop knows; a pydantic model so it can be queried and carried over.

    It holds what the turn waits for too (the waiting calls, the decisions, the rules, the
    budget as it stands), which the kinds of wait in ``turnkeep.workflows.waits`` read and
    change: what they decided is carried over with the rest."""

    plan: TurnPlan
    tools: list[ToolSpec] = Field(default_factory=list)
    history: list[Message]
    messages: list[Message] = Field(default_factory=list)  # appended this turn
    iteration: int = 0
    model_calls: int = 0
    finalizing: bool = False  # the deferred structured-output call has been asked for
    done: bool = False
    stop_reason: StopReason | None = None
    usage: dict[str, Usage] = Field(default_factory=dict)
    rollback: RollbackState | None = None
    # Compaction replaces `(history + messages)[:compacted_upto]` with one summary message in
    # what the model sees; `messages` itself keeps everything the turn appended.
    summary: Message | None = None
    compacted_upto: int = 0
    compaction_failed: bool = False
    # Only in the state a run hands to its continuation (continue-as-new): it was cut after the
    # model asked for tools and before they ran, so the next run starts by running them.
    cut_before_tools: bool = False
    # Tool calls of the current batch waiting for a person's decision, by call id.
    pending_approvals: dict[str, PendingCall] = Field(default_factory=dict)
    # The calls waiting in the child turns of the batch's agent calls (and in theirs), by child
    # turn id, as each child last reported them. Never carried over: a run continues as new only
    # between steps, with no child turn running, and children report again.
    descendant_approvals: dict[str, list[PendingCall]] = Field(default_factory=dict, exclude=True)
    # Every decision taken on this turn's calls, in order: the audit trail.
    decisions: list[DecisionRecord] = Field(default_factory=list)
    # What a server asked during a tool call and waits for a person under its wait id, and the
    # answers given, until the waiting call takes them. Never carried over: a run continues as
    # new only between steps, with no tool call running.
    server_asks: dict[str, ServerRequest] = Field(default_factory=dict, exclude=True)
    server_answers: dict[str, ServerAnswer] = Field(default_factory=dict, exclude=True)
    # The "always allow" rules: its session's (`TurnInput.allow_rules`), then those its
    # decisions set, revoked ones kept (marked) for the audit.
    allow_rules: list[AllowRule] = Field(default_factory=list)
    # Whether the turn is a session's (its child, under the session's turn ids): only then may
    # a decision be remembered for the session.
    in_session: bool = False
    # The results clients submitted for client-side calls, until the waiting call takes them.
    # Never carried over: a run continues as new only between steps, with no call waiting.
    submitted: dict[str, CallToolResult] = Field(default_factory=dict, exclude=True)
    # Where `history` is stored, for a session's turn (`TurnInput.history_ref`).
    history_ref: ConversationRef | None = None
    # The segment in which the session stored the turn's input (`TurnInput.messages_segment`)
    # and how many messages of `messages` it holds: set when they begin `messages`.
    messages_segment: tuple[str, int] | None = None
    # `TurnInput.depth`, and the usage of the agents this turn called as tools, by agent and
    # model (the turn's own model calls are in `usage`).
    depth: int = 0
    team_usage: dict[str, dict[str, Usage]] = Field(default_factory=dict)
    # The budget as it stands (the plan's, plus what people raised it by), what its session's
    # earlier turns spent, and the model call a person let through past it (its index).
    budget_limit: float | None = None
    budget_raised: float = 0.0
    session_spent: Spent | None = None
    budget_passed: int = 0

    # -- starting -------------------------------------------------------------------------

    @classmethod
    def start(cls, turn: TurnInput, plan: TurnPlan, *, in_session: bool = False) -> TurnState:
        """Auto-heal a history left dangling by an interrupted turn, then add the new input.

        As in fast-agent, the history is healed only when it is used and none of the new
        messages carries tool results: those answer the dangling calls themselves, and a
        second, contradictory result for the same call id is refused by strict providers.
        ``in_session``: the turn is a session's (the workflow has checked that it is, and so
        that ``turn.allow_rules`` are the session's)."""
        state = cls(
            plan=plan,
            history=list(turn.history),
            history_ref=turn.history_ref,
            depth=turn.depth,
            allow_rules=[r for r in turn.allow_rules if r.active and r.scope == "session"],
            in_session=in_session,
        )
        if plan.budget is not None:
            state.session_spent = turn.session_spent if plan.budget.per == "session" else None
            state.budget_limit = budget_math.opening_limit(plan.budget, state.session_spent)
        if plan.use_history and not any(m.tool_results for m in turn.messages):
            state._heal(turn.history)
        if turn.messages_segment is not None and not state.messages:
            state.messages_segment = (turn.messages_segment, len(turn.messages))
        state.messages.extend(turn.messages)
        # A tool request at the end of the new messages has nobody to answer it either: left
        # open, the model would be sent (and the next turn inherit) an unanswered call.
        state._heal(turn.messages)
        return state

    def _heal(self, conversation: list[Message]) -> None:
        heal, rollback = repair_dangling_tool_calls(conversation, completed={})
        if heal is not None:
            self.messages.append(heal)
            self.rollback = rollback

    # -- continuing as new ----------------------------------------------------------------

    def carry(self, *, before_tools: bool) -> TurnState:
        """The state a run hands to the next one when it continues as new. ``history`` is left
        out: the next run gets the same ``TurnInput``, so it is not recorded twice."""
        return self.model_copy(update={"history": [], "cut_before_tools": before_tools})

    @classmethod
    def resume(cls, turn: TurnInput, carried: TurnState) -> TurnState:
        """The state a continued run starts from: what its predecessor carried over."""
        return carried.model_copy(update={"history": list(turn.history), "cut_before_tools": False})

    # -- asking the model -----------------------------------------------------------------

    def conversation(self) -> list[Message]:
        """The conversation as the model sees it (and as the next turn's history)."""
        # use_history=false: the model sees only the instruction plus this turn's delta.
        if not self.plan.use_history:
            return self.messages
        full = self.history + self.messages
        return [self.summary, *full[self.compacted_upto :]] if self.summary else full

    def model_request(self) -> LlmRequest:
        """The one place the model's input is assembled."""
        conversation = self.conversation()
        return LlmRequest(
            agent=self.plan.agent,
            model=self.plan.model,
            call_index=self.model_calls + 1,
            instruction=self.plan.instruction,
            messages=conversation,
            tools=[] if self.finalizing else self.tools,
            # With tools on offer the schema waits for the deferred final call, as in fast-agent.
            structured_output=self.plan.structured_output
            if self.finalizing or not self.tools
            else None,
            temperature=self.plan.temperature,
            max_tokens=self.plan.max_tokens,
        )

    def on_assistant(self, assistant: Message, model: str | None = None) -> None:
        """Record a model answer (by ``model``: a fallback's, else the plan's) and decide: run
        tools, ask for the final JSON, or stop."""
        self.model_calls += 1
        self.messages.append(assistant)
        self.count_usage(assistant, model)
        if self.finalizing:
            # The deferred structured-output call offered no tools: it ends the turn whatever
            # it says, and calls it makes anyway are answered rather than run.
            self._close_pending("Not run: no tools are available for the final answer.")
            self._finish(assistant.stop_reason or StopReason.END_TURN)
            return
        if self.awaiting_tools:
            return
        if self.plan.structured_output and self.tools and not self.finalizing:
            self.finalizing = True
            self.messages.append(Message.user(STRUCTURED_FINALIZATION_PROMPT))
            return
        self._finish(assistant.stop_reason or StopReason.END_TURN)

    @property
    def awaiting_tools(self) -> bool:
        """The only signal that continues the loop: the last answer stopped for tool use.

        Even with no tool calls, as in fast-agent: the batch is empty, its results message
        too, and the iteration still counts, so ``max_iterations`` bounds such a loop."""
        last = self._last()
        return (
            not self.done
            and last is not None
            and last.role == "assistant"
            and last.stop_reason == StopReason.TOOL_USE
        )

    # -- running tools --------------------------------------------------------------------

    def tool_batch(self) -> ToolBatch:
        """Plan the pending calls; unknown tools are answered here while the others still run."""
        calls = self.messages[-1].tool_calls or {}
        available = {tool.name for tool in self.tools}
        to_run: list[ToolCallRequest] = []
        gated: list[ToolCallRequest] = []
        client: list[ToolCallRequest] = []
        answered: dict[str, CallToolResult] = {}
        approval = self.plan.approval
        for call_id, call in calls.items():
            if call.name not in available:
                answered[call_id] = CallToolResult.error(_not_available(call.name, available))
            elif call.invalid_arguments is not None:
                answered[call_id] = CallToolResult.error(
                    f"Tool '{call.name}' was called with arguments that are not a JSON object: "
                    f"{call.invalid_arguments[:500]}"
                )
            else:
                request = ToolCallRequest(
                    agent=self.plan.agent, call_id=call_id, name=call.name, arguments=call.arguments
                )
                if self.plan.client_tools and self.plan.client_tool(call.name):
                    # Its client answers: no approval on top, the client is who decides.
                    client.append(request)
                    continue
                gate = approval is not None and approval.needs_approval(call.name)
                (gated if gate else to_run).append(request)
        return ToolBatch(to_run=to_run, answered=answered, gated=gated, client=client)

    def runs_every_pending_call(self) -> bool:
        """Whether each call of the pending tool request runs as a tool activity (none is
        answered without running: an unknown tool, arguments that are not an object). A
        request without calls runs none: nothing else would tell that it was made."""
        if not self.awaiting_tools:
            return False
        batch = self.tool_batch()
        return bool(batch.to_run) and not batch.answered and not batch.gated and not batch.client

    # -- tool results and usage ----------------------------------------------------------

    def on_tool_results(
        self, results: dict[str, CallToolResult], timing_ms: dict[str, float]
    ) -> None:
        """Append the results as one user message (in call order); then count and cap."""
        calls = self.messages[-1].tool_calls or {}
        ordered = {call_id: results[call_id] for call_id in calls}
        timing = {call_id: {"timing_ms": round(ms, 3)} for call_id, ms in timing_ms.items()}
        # A request without calls gets fast-agent's empty results message: nothing was timed.
        channels = {"tool_timing": json_channel(timing)} if timing else None
        self.messages.append(Message(role="user", tool_results=ordered, channels=channels))
        self.iteration += 1
        # Checked after the batch ran, so a cap of N allows N+1 model calls and the history
        # never ends on a call without its result.
        if self.iteration > self.plan.max_iterations:
            # Replaced, not changed in place: a message in the conversation never changes
            # (model calls' digests rely on it, see model_io.MessageJson).
            self.messages[-2] = self.messages[-2].model_copy(
                update={"stop_reason": StopReason.MAX_ITERATIONS}
            )
            self._finish(StopReason.MAX_ITERATIONS)

    def on_agent_usage(self, usage: dict[str, dict[str, Usage]]) -> None:
        """Count the usage of an agent this turn called as a tool (``usage`` by agent, then
        model: the agent's own and that of the agents it called)."""
        self.team_usage = _merged(self.team_usage, usage)

    def on_model_answer(self, answer: Message) -> None:
        """Count a workflow agent's own model call (a router's choice), kept out of the
        conversation: its answer is its agents'."""
        self.model_calls += 1
        self.count_usage(answer)

    def end_with(self, answer: Message) -> None:
        """End the turn with ``answer``, its final message (a workflow agent's answer, its
        steps having run as child turns; the budget's stop)."""
        self.messages.append(answer)
        self._finish(answer.stop_reason or StopReason.END_TURN)

    def total_usage(self) -> dict[str, Usage]:
        """Per model, the turn's own usage and that of every agent it called as a tool."""
        total = dict(self.usage)
        for by_model in self.team_usage.values():
            for model, usage in by_model.items():
                total[model] = total.get(model, Usage()) + usage
        return total

    # -- compaction -----------------------------------------------------------------------

    def compaction_cut(
        self, estimate: Callable[[list[Message]], int] = estimate_tokens
    ) -> int | None:
        """Where to split the conversation for a summary before the next model call, or None.

        Only before a follow-up call (the last message holds tool results), once the estimated
        context (``estimate``: ``estimate_tokens`` or the same number worked out faster)
        reaches the agent's threshold; the pending tool exchange and the last few exchanges
        are kept, so the cut falls just before an assistant message."""
        compaction = self.plan.compaction
        last = self._last()
        if (
            compaction is None
            or self.compaction_failed
            or not self.plan.use_history
            or last is None
            or not last.tool_results
        ):
            return None
        request = self.model_request()
        if estimate(request.messages) < compaction.threshold_tokens:
            return None
        conversation = request.messages
        starts = [i for i, m in enumerate(conversation) if m.role == "assistant"]
        keep = compaction.keep_exchanges + 1  # + the pending tool exchange
        if len(starts) < keep:
            return None
        cut = starts[-keep]
        # Nothing worth summarising: at most an earlier summary and one message.
        return cut if cut >= 2 else None

    def on_compacted(self, cut: int, summary: str) -> None:
        """Replace the conversation before ``cut`` (an index into ``conversation()``)."""
        # With a summary in place, conversation()[i] is (history + messages)[compacted_upto+i-1].
        self.compacted_upto = self.compacted_upto + cut - 1 if self.summary else cut
        self.summary = Message.user(SUMMARY_PREFIX + summary)

    # -- hooks ----------------------------------------------------------------------------

    def hook_context(self, point: HookPoint) -> HookContext:
        # fast-agent hands after_llm_call the model's answer and after_turn_complete the final
        # one, even when messages were appended after it (the results of a capped turn's last
        # batch, the structured-output prompt, calls answered as not run).
        answered = point in (HookPoint.AFTER_LLM_CALL, HookPoint.AFTER_TURN_COMPLETE)
        return HookContext(
            hook_point=point,
            agent=self.plan.agent,
            model=self.plan.model,
            iteration=self.iteration,
            messages=self.messages,
            last_message=self._final() if answered else self._last(),
            usage=self.usage,
        )

    def on_hook(self, hook: str, change: HookChange) -> None:
        if change.replace is not None:
            self.messages = list(change.replace)
        if change.stop_reason is not None:
            self._close_pending(f"Not run: hook '{hook}' ended the turn.")
        self.messages.extend(change.append)
        if change.stop_reason is not None:
            self._finish(change.stop_reason)

    def fail(self, text: str) -> None:
        """End the turn with an ``error`` assistant message (e.g. a hook that must not fail)."""
        self._close_pending("Not run: the turn ended with an error.")
        self.messages.append(
            Message(
                role="assistant",
                content=[TextContent(text=text)],
                channels={"error": [TextContent(text=text)]},
                stop_reason=StopReason.ERROR,
            )
        )
        self._finish(StopReason.ERROR)

    def _close_pending(self, text: str) -> None:
        # A turn that stops while tool calls wait must not leave them unanswered.
        calls = self.messages[-1].tool_calls if self.awaiting_tools else None
        if calls:
            results = {call_id: CallToolResult.error(text) for call_id in calls}
            self.messages.append(Message(role="user", tool_results=results))

    # -- ending ---------------------------------------------------------------------------

    def cancel(self, completed: dict[str, CallToolResult]) -> None:
        """Repair the conversation the way fast-agent does when a turn is interrupted."""
        # Calls awaiting approval are repaired as interrupted, like any other unanswered call.
        self.pending_approvals.clear()
        self.server_asks.clear()
        self.descendant_approvals.clear()
        self.submitted.clear()
        if not self.plan.use_history:
            self.rollback = RollbackState.HISTORY_DISABLED
        else:
            repair, rollback = repair_dangling_tool_calls(
                self.history + self.messages, completed=completed
            )
            if repair is not None:
                self.messages.append(repair)
            self.rollback = rollback
        self._finish(StopReason.CANCELLED)

    def result(self) -> TurnResult:
        final = self._final()
        result = TurnResult(
            final=final,
            messages=self.messages,
            history=self.conversation() if self.plan.use_history else self.history,
            history_change=self._history_change(),
            stop_reason=self.stop_reason or StopReason.END_TURN,
            iterations=self.iteration,
            usage=self.total_usage(),
            usage_by_agent=_merged({self.plan.agent: self.usage}, self.team_usage)
            if self.team_usage
            else {},
            rollback=self.rollback,
            structured=_parse_json(final.text) if final and self.plan.structured_output else None,
            decisions=self.decisions,
            budget_raised=self.budget_raised,
            session_budget=self.plan.budget is not None and self.plan.budget.per == "session",
            allow_rules=self.allow_rules,
        )
        # Read by the parent turn alone (its workflow code): written compactly.
        result._for_parent = self.depth > 0
        if self.history_ref is not None:
            # A session's turn hands its messages back as a segment of the session's stored
            # conversation, and the conversation by reference.
            result.conversation, result._segment = after_turn(
                self.history_ref,
                self.messages,
                appended=self.plan.use_history,
                summary=self.summary,
                compacted_upto=self.compacted_upto,
                given=self.messages_segment,
            )
        return result

    def _history_change(self) -> HistoryChange:
        if not self.plan.use_history:
            return HistoryChange.UNCHANGED
        return HistoryChange.COMPACTED if self.summary else HistoryChange.APPENDED

    def _last(self) -> Message | None:
        return self.messages[-1] if self.messages else None

    def _final(self) -> Message | None:
        """The turn's last assistant message: its answer so far."""
        return next((m for m in reversed(self.messages) if m.role == "assistant"), None)

    def _finish(self, stop_reason: StopReason) -> None:
        self.done = True
        self.stop_reason = stop_reason

    def count_usage(self, assistant: Message, model: str | None = None) -> None:
        """Count the usage a model's ``assistant`` answer reports (by ``model``: a fallback's, a
        server's sampling model, else the plan's)."""
        reported = assistant.channel_json("usage")
        if reported is None:
            return
        usage = Usage.model_validate({**reported, "calls": 1})
        model = model or self.plan.model
        self.usage[model] = self.usage.get(model, Usage()) + usage


def _merged(
    a: dict[str, dict[str, Usage]], b: dict[str, dict[str, Usage]]
) -> dict[str, dict[str, Usage]]:
    merged = {agent: dict(by_model) for agent, by_model in a.items()}
    for agent, by_model in b.items():
        mine = merged.setdefault(agent, {})
        for model, usage in by_model.items():
            mine[model] = mine.get(model, Usage()) + usage
    return merged


def _not_available(name: str, available: set[str]) -> str:
    """fast-agent's answer to a call of a tool the agent does not have."""
    if not available:
        return f"Tool '{name}' is not available. No tools are currently available."
    return f"Tool '{name}' is not available. Available tools: {', '.join(sorted(available))}."


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
