"""Loop *control* for one turn: when to call the model, which tool calls to run, when to stop.

Pure and synchronous — no Temporal, no I/O — so every rule of the turn loop (the
documentation's *The turn loop*) is testable without a server. ``TurnWorkflow`` owns the *actions*
(model and tool activities) and feeds their results back here; this is fast-agent's ``ToolRunner``
with the agent callbacks taken out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from turnkeep.contract.activity_io import (
    TOOL_SEPARATOR,
    HookChange,
    HookContext,
    HookPoint,
    ToolCallRequest,
    ToolSpec,
    TurnPlan,
)
from turnkeep.contract.approval import (
    TIMEOUT_DECIDER,
    AllowRule,
    Decision,
    DecisionRecord,
    PendingCall,
    allowed_by,
    format_seconds,
    result_problem,
    revoke_problem,
    revoked,
)
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
from turnkeep.contract.server_requests import (
    SERVER_POLICY_DECIDER,
    ServerAnswer,
    ServerRequest,
    coerce_content,
    content_problem,
    elicit_answer,
)
from turnkeep.contract.turn_io import (
    BudgetUnit,
    HistoryChange,
    RollbackState,
    Spent,
    TurnInput,
    TurnResult,
    Usage,
)
from turnkeep.workflows.repair import repair_dangling_tool_calls
from turnkeep.workflows.tool_batch import ToolBatch, covering

# Seconds a server's request waits for a person when neither the server nor the agent's
# approval rules say.
DEFAULT_INPUT_TIMEOUT = 86400.0
SUMMARY_PREFIX = "Summary of the earlier conversation:\n\n"
STRUCTURED_FINALIZATION_PROMPT = (
    "Now produce the final answer as structured JSON matching the requested schema. "
    "Do not call any tools."
)


class TurnState(BaseModel):
    """Everything the loop knows; a pydantic model so it can be queried and carried over."""

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
            raised = state.session_spent.raised if state.session_spent else 0.0
            # Never past the most the agent lets people raise it to.
            ceiling = plan.budget.max_raise
            limit = plan.budget.limit + raised
            state.budget_limit = (
                limit if ceiling is None else min(limit, max(ceiling, plan.budget.limit))
            )
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
        self._add_usage(assistant, model)
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

    # -- approvals --------------------------------------------------------------------------

    def await_approval(self, call: ToolCallRequest, now: datetime) -> None:
        self.pending_approvals[call.call_id] = PendingCall(
            call_id=call.call_id, name=call.name, arguments=call.arguments, since=now
        )

    def await_input(
        self, call: ToolCallRequest, wait_id: str, request: ServerRequest, now: datetime
    ) -> None:
        """Hold ``call`` while a person answers what its server asked (``request``), under
        ``wait_id``."""
        self.pending_approvals[wait_id] = PendingCall(
            call_id=wait_id,
            name=call.name,
            arguments=call.arguments,
            since=now,
            kind=request.kind,
            prompt=request.prompt(),
            requested_schema=request.requested_schema,
        )
        self.server_asks[wait_id] = request

    def decline_server_request(
        self, call: ToolCallRequest, wait_id: str, request: ServerRequest, now: datetime
    ) -> DecisionRecord:
        """Record a request the agent's config declined (or cancelled) at once."""
        record = DecisionRecord(
            call_id=wait_id,
            tool=call.name,
            decision="deny",
            by=SERVER_POLICY_DECIDER,
            reason=request.reason or f"{request.kind} is not enabled for this server",
            at=now,
            kind=request.kind,
        )
        self.decisions.append(record)
        return record

    def on_sampling(self, model: str, answer: Message) -> None:
        """Count a model call made for a server's sampling request (under its own model)."""
        self._add_usage(answer, model)

    def await_client_result(self, call: ToolCallRequest, now: datetime) -> None:
        """Hold a call of a client-side tool until a client submits its result."""
        tool = self.plan.client_tool(call.name)
        assert tool is not None, "only calls of client-side tools wait for a client"
        self.pending_approvals[call.call_id] = PendingCall(
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
            since=now,
            kind="client_result",
            requested_schema=tool.output_schema,
        )

    @property
    def awaits_decision(self) -> bool:
        """Whether a call of this turn, or of one of its child turns, waits for a person."""
        return bool(self.pending_approvals) or any(self.descendant_approvals.values())

    def waiting_calls(self) -> list[PendingCall]:
        """The calls waiting for a decision: the turn's own, then its child turns'."""
        descendants = [c for calls in self.descendant_approvals.values() for c in calls]
        return [*self.pending_approvals.values(), *descendants]

    def reported_calls(self, turn_id: str) -> list[PendingCall]:
        """``waiting_calls`` as this turn, ``turn_id``, reports them to its parent turn: its own
        calls say whose they are."""
        own = [
            c.model_copy(update={"turn_id": turn_id, "agent": self.plan.agent})
            for c in self.pending_approvals.values()
        ]
        return [*own, *self.waiting_calls()[len(own) :]]

    def call_owners(self, call_id: str) -> list[str]:
        """The child turns (by id) in which a call ``call_id`` waits, unless it is the turn's own
        call."""
        if call_id in self.pending_approvals:
            return []
        owners = (
            c.turn_id
            for calls in self.descendant_approvals.values()
            for c in calls
            if c.call_id == call_id
        )
        return list(dict.fromkeys(o for o in owners if o is not None))

    def decision_problem(self, decision: Decision) -> str | None:
        """Why ``decision`` cannot be taken now, or None: the update's validator refuses it
        with this text and the turn goes on unaffected."""
        call = decision.call_id
        if self.done:
            return f"the turn has ended ({self.stop_reason}); no call waits for a decision"
        if call not in self.pending_approvals and self.decision(call) is not None:
            return f"call {call!r} has already been decided"
        if call not in self.pending_approvals:
            waiting = ", ".join(sorted(self.pending_approvals)) or "none"
            return f"no call {call!r} is waiting for approval (waiting: {waiting})"
        pending = self.pending_approvals[call]
        kind = pending.kind
        if kind == "budget":
            return self._budget_decision_problem(decision)
        if decision.limit is not None:
            return "a limit goes only with a budget's wait"
        if kind == "client_result":
            return _client_result_problem(decision, pending)
        if decision.result is not None:
            return (
                f"call {call!r} ({pending.name}) is not a client-side tool's: it is approved or "
                "denied, not given a result"
            )
        if decision.arguments is not None and kind != "approval":
            return f"arguments (an edit) go only with a tool call's approval, not {kind}"
        if decision.arguments is not None and decision.decision != "approve":
            return "arguments (an edit) go only with an approval"
        if decision.remember is not None and decision.decision != "approve":
            return "remember (always allow) goes only with an approval"
        if decision.remember is not None and kind != "approval":
            return f"remember (always allow) goes only with a tool call's approval, not {kind}"
        if decision.remember_arguments and decision.remember is None:
            return "remember_arguments goes only with remember"
        if decision.remember == "session" and not self.in_session:
            return "remember: session needs a session's turn; this turn is no session's"
        if (decision.content is not None or decision.cancel) and kind != "elicitation":
            return f"content and cancel answer an elicitation; {call!r} waits for {kind}"
        if kind == "elicitation":
            return self._elicitation_problem(decision)
        return None

    def _elicitation_problem(self, decision: Decision) -> str | None:
        if decision.decision == "deny":
            if decision.content is not None:
                return "content goes only with an answer (approve), not with a decline or cancel"
            return None
        if decision.cancel:
            return "cancel goes only with deny"
        schema = self.pending_approvals[decision.call_id].requested_schema
        problem = content_problem(schema, decision.content or {})
        return f"the content does not match the requested schema: {problem}" if problem else None

    def decide(
        self, decision: Decision, now: datetime, rule_id: str | None = None
    ) -> DecisionRecord:
        """Record a person's decision on a waiting call (checked by ``decision_problem``). One
        that remembers (``rule_id``: the new rule's id) also sets an "always allow" rule, which
        allows at once the batch's other waiting calls it covers."""
        if self.pending_approvals[decision.call_id].kind == "budget":
            return self._decide_budget(decision, now)
        pending = self.pending_approvals.pop(decision.call_id)
        if pending.kind == "client_result":
            return self._answer_client_call(decision, pending, now)
        if pending.kind != "approval":
            return self._answered(pending, decision, now)
        edited = decision.arguments is not None and decision.arguments != pending.arguments
        rule = None
        if decision.remember is not None:
            assert rule_id is not None, "a remembered decision sets a rule, with an id"
            rule = AllowRule(
                id=rule_id,
                tool=pending.name,
                arguments=(decision.arguments or pending.arguments)
                if decision.remember_arguments
                else None,
                scope=decision.remember,
                by=decision.by,
                at=now,
                call_id=pending.call_id,
            )
            self.allow_rules.append(rule)
        record = self._record(
            pending,
            decision,
            now,
            original_arguments=pending.arguments if edited else None,
            arguments=decision.arguments if edited else None,
            rule=rule.id if rule else None,
            remember=decision.remember,
        )
        if rule is not None:
            self._allow_waiting(now)
        return record

    def _record(
        self, pending: PendingCall, decision: Decision, now: datetime, **fields: Any
    ) -> DecisionRecord:
        """Record ``decision`` on the waiting call ``pending`` (``fields``: what its kind adds
        or says otherwise)."""
        record = DecisionRecord.model_validate(
            {
                "call_id": pending.call_id,
                "tool": pending.name,
                "decision": decision.decision,
                "by": decision.by,
                "reason": decision.reason,
                "at": now,
                "kind": pending.kind,
                **fields,
            }
        )
        self.decisions.append(record)
        return record

    def _answer_client_call(
        self, decision: Decision, pending: PendingCall, now: datetime
    ) -> DecisionRecord:
        if decision.result is not None and decision.decision == "approve":
            self.submitted[pending.call_id] = decision.result.as_result()
        return self._record(pending, decision, now)

    def _answered(self, pending: PendingCall, decision: Decision, now: datetime) -> DecisionRecord:
        """A person's answer to what a server asked: the record, and for an elicitation the
        answer the call's next run gives the server."""
        request = self.server_asks.pop(pending.call_id)
        reason = decision.reason
        if pending.kind == "elicitation":
            if decision.decision == "approve":
                content = coerce_content(pending.requested_schema, decision.content or {})
                answer = elicit_answer(request, "accept", content)
            else:
                answer = elicit_answer(request, "cancel" if decision.cancel else "decline")
                reason = reason or ("cancelled" if decision.cancel else "declined")
            self.server_answers[pending.call_id] = answer
        return self._record(pending, decision, now, reason=reason)

    def _allow_waiting(self, now: datetime) -> None:
        """Approve the waiting calls a rule now covers, as ``apply_rules`` would have."""
        for call in list(self.pending_approvals.values()):
            rule = covering(self.allow_rules, call.name, call.arguments)
            if call.kind != "approval" or rule is None:
                continue
            del self.pending_approvals[call.call_id]
            self.decisions.append(allowed_by(rule, call.call_id, call.name, now))

    def time_out(self, call_id: str, now: datetime) -> DecisionRecord:
        """Deny a call nobody decided on in time (``on_timeout: deny``; a budget's wait: the
        turn stops)."""
        pending = self.pending_approvals.pop(call_id)
        if pending.kind == "budget":
            timeout = self.plan.budget.timeout if self.plan.budget else 0.0
        elif pending.kind == "client_result" and self.plan.client_tools:
            timeout = self.plan.client_tools.timeout
        elif pending.kind != "approval":
            timeout = self.input_timeout(pending.name)
            request = self.server_asks.pop(call_id)
            if pending.kind == "elicitation":
                # Nobody answering is MCP's cancel ("dismissed without an explicit choice").
                self.server_answers[call_id] = elicit_answer(request, "cancel")
        else:
            timeout = self.plan.approval.timeout if self.plan.approval else 0.0
        record = DecisionRecord(
            call_id=call_id,
            tool=pending.name,
            decision="timeout",
            by=TIMEOUT_DECIDER,
            reason=f"no decision within {format_seconds(timeout)}",
            at=now,
            kind=pending.kind,
        )
        self.decisions.append(record)
        return record

    def input_timeout(self, tool: str) -> float:
        """Seconds what a server of ``tool`` asks may wait for a person: the server's own
        timeout, else the agent's approval timeout, else a day."""
        server = self.plan.server_requests.get(tool.partition(TOOL_SEPARATOR)[0])
        if server is not None and server.elicitation_timeout is not None:
            return server.elicitation_timeout
        return self.plan.approval.timeout if self.plan.approval else DEFAULT_INPUT_TIMEOUT

    # -- always allow -----------------------------------------------------------------------

    def revoke_problem(self, rule_id: str) -> str | None:
        if self.done:
            return f"the turn has ended ({self.stop_reason}); its rules ended with it"
        return revoke_problem(self.allow_rules, rule_id, "this turn")

    def revoke(self, rule_id: str, by: str, now: datetime) -> AllowRule | None:
        """Revoke a rule (checked by ``revoke_problem``; a session's revocation it relays may
        name one the turn does not have, which changes nothing): the calls it covered wait
        again."""
        for i, rule in enumerate(self.allow_rules):
            if rule.id == rule_id and rule.active:
                self.allow_rules[i] = revoked(rule, by, now)
                return self.allow_rules[i]
        return None

    def decision(self, call_id: str) -> DecisionRecord | None:
        return next((r for r in reversed(self.decisions) if r.call_id == call_id), None)

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
        self._add_usage(answer)

    def on_team_answer(self, answer: Message) -> None:
        """Record a workflow agent's answer (its steps ran as child turns): the turn ends."""
        self.messages.append(answer)
        self._finish(answer.stop_reason or StopReason.END_TURN)

    def total_usage(self) -> dict[str, Usage]:
        """Per model, the turn's own usage and that of every agent it called as a tool."""
        total = dict(self.usage)
        for by_model in self.team_usage.values():
            for model, usage in by_model.items():
                total[model] = total.get(model, Usage()) + usage
        return total

    # -- budget -----------------------------------------------------------------------------

    def budget_spent(self) -> float:
        """What counts against the budget so far, in its unit: every token (or dollar) of the
        turn's model calls and of the agents it called as tools, and for a budget per session,
        what the session's earlier turns spent. A dollar budget counts the priced part (the
        worker refuses one on an agent whose own models have no price)."""
        budget = self.plan.budget
        if budget is None:
            return 0.0
        usage = self.total_usage().values()
        earlier = self.session_spent
        if budget.unit == "tokens":
            return float(sum(u.tokens for u in usage) + (earlier.tokens if earlier else 0))
        return sum(u.cost_usd or 0.0 for u in usage) + (earlier.usd if earlier else 0.0)

    def budget_exceeded(self, estimated_input_tokens: int) -> str | None:
        """Why the next model call would pass the budget, or None: what is spent has reached
        it, or what is spent plus the next call's estimated input (its tokens, or their cost at
        the plan's input price) is over it. The output cannot be known before the call, and a
        call is never stopped halfway: one call may end past the budget, and the next asks."""
        budget, limit = self.plan.budget, self.budget_limit
        if budget is None or limit is None or self.budget_passed == self.model_calls + 1:
            return None
        spent = self.budget_spent()
        said = f"spent {budget_amount(spent, budget.unit)} of {budget_amount(limit, budget.unit)}"
        if spent >= limit:
            return said
        if budget.unit == "tokens":
            upcoming = float(estimated_input_tokens)
        else:
            upcoming = estimated_input_tokens * (budget.input_usd_per_token or 0.0)
        if spent + upcoming > limit:
            about = budget_amount(upcoming, budget.unit)
            return f"{said}; the next model call's input, about {about}, would pass it"
        return None

    def budget_call_id(self) -> str:
        return f"budget:{self.model_calls + 1}"

    def await_budget(self, problem: str, now: datetime) -> PendingCall:
        """Hold the next model call for a person's decision on the budget."""
        budget = self.plan.budget
        assert budget is not None and self.budget_limit is not None
        call = PendingCall(
            call_id=self.budget_call_id(),
            name="budget",
            arguments={
                "spent": self.budget_spent(),
                "limit": self.budget_limit,
                "unit": budget.unit,
                "max_raise": budget.max_raise,
            },
            since=now,
            kind="budget",
            prompt=problem,
        )
        self.pending_approvals[call.call_id] = call
        return call

    def _budget_decision_problem(self, decision: Decision) -> str | None:
        budget = self.plan.budget
        assert budget is not None
        if decision.arguments is not None:
            return "a budget's wait takes a limit (the raised budget), not arguments"
        if (
            decision.result is not None
            or decision.content is not None
            or decision.cancel
            or decision.remember is not None
        ):
            return (
                "a budget's wait is decided with a limit (raise) or a denial (stop), nothing else"
            )
        if decision.decision == "deny":
            return "a limit goes only with raising the budget" if decision.limit else None
        if decision.limit is None:
            return f"raising the budget needs a limit: the new budget, in {budget.unit}"
        spent = self.budget_spent()
        if decision.limit <= spent:
            return (
                f"a limit of {budget_amount(decision.limit, budget.unit)} is not above what is "
                f"spent ({budget_amount(spent, budget.unit)})"
            )
        if budget.max_raise is not None and decision.limit > budget.max_raise:
            return (
                f"a limit of {budget_amount(decision.limit, budget.unit)} is above the most "
                f"agent {self.plan.agent!r} allows ({budget_amount(budget.max_raise, budget.unit)})"
            )
        return None

    def _decide_budget(self, decision: Decision, now: datetime) -> DecisionRecord:
        pending = self.pending_approvals.pop(decision.call_id)
        before = self.budget_limit or 0.0
        raised = decision.decision == "approve" and decision.limit is not None
        if raised and decision.limit is not None:
            self.budget_raised += decision.limit - before
            self.budget_limit = decision.limit
            self.budget_passed = self.model_calls + 1
        return self._record(
            pending,
            decision,
            now,
            original_arguments={"limit": before} if raised else None,
            arguments={"limit": decision.limit} if raised else None,
        )

    def stop_at_budget(self, problem: str, record: DecisionRecord | None = None) -> None:
        """End the turn before its next model call, with a final assistant message saying
        why: the agent stops at its budget, or nobody (or a person) raised it."""
        budget = self.plan.budget
        why = "" if record is None else f" ({_budget_stopped_by(record)})"
        text = f"Stopped at the budget: {problem}{why}."
        detail = {
            "spent": self.budget_spent(),
            "limit": self.budget_limit,
            "unit": budget.unit if budget else None,
        }
        self.messages.append(
            Message(
                role="assistant",
                content=[TextContent(text=text)],
                channels={"budget": json_channel(detail)},
                stop_reason=StopReason.PAUSE,
            )
        )
        self._finish(StopReason.PAUSE)

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

    def _add_usage(self, assistant: Message, model: str | None = None) -> None:
        reported = assistant.channel_json("usage")
        if reported is None:
            return
        usage = Usage.model_validate({**reported, "calls": 1})
        model = model or self.plan.model
        self.usage[model] = self.usage.get(model, Usage()) + usage


def budget_amount(value: float, unit: BudgetUnit) -> str:
    """``12,000 tokens``, ``1.25 USD``: an amount of a budget as a person reads it."""
    if unit == "tokens":
        return f"{round(value):,} tokens"
    return f"{value:,.2f} USD" if value >= 100 else f"{value:.4g} USD"


def _budget_stopped_by(record: DecisionRecord) -> str:
    if record.decision == "timeout":
        return record.reason or "no decision in time"
    said = f": {record.reason}" if record.reason else ""
    return f"{record.by} chose to stop{said}"


def _merged(
    a: dict[str, dict[str, Usage]], b: dict[str, dict[str, Usage]]
) -> dict[str, dict[str, Usage]]:
    merged = {agent: dict(by_model) for agent, by_model in a.items()}
    for agent, by_model in b.items():
        mine = merged.setdefault(agent, {})
        for model, usage in by_model.items():
            mine[model] = mine.get(model, Usage()) + usage
    return merged


def _client_result_problem(decision: Decision, pending: PendingCall) -> str | None:
    """Why ``decision`` does not answer ``pending``, a client-side tool's call, or None."""
    if decision.arguments is not None:
        return f"call {pending.call_id!r} is a client-side tool's: it takes a result, not arguments"
    if decision.remember is not None or decision.remember_arguments:
        return f"call {pending.call_id!r} is a client-side tool's: its client answers each call"
    if decision.content is not None or decision.cancel:
        return "content and cancel answer an elicitation, not a client-side tool's call"
    if decision.decision == "deny":
        return "a denial takes no result" if decision.result is not None else None
    if decision.result is None:
        return f"call {pending.call_id!r} ({pending.name}) waits for its result: submit one"
    return result_problem(decision.result, pending.requested_schema)


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
