"""The budget before a model call: the call that would pass it waits for a person to raise it
(with a new limit) or stop the turn, unless the agent stops at its budget outright."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow

from turnkeep.contract.approval import Decision, DecisionRecord, PendingCall
from turnkeep.contract.messages import Message, StopReason, TextContent, json_channel
from turnkeep.contract.model_io import LlmRequest
from turnkeep.workflows import budget_math, pending_calls, visibility, worker_cache
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits.base import Turn, Wait


def spent(state: TurnState) -> float:
    """What counts against the budget so far, in its unit: every token (or dollar) of the
    turn's model calls and of the agents it called as tools, and for a budget per session, what
    the session's earlier turns spent."""
    budget = state.plan.budget
    if budget is None:
        return 0.0
    return budget_math.spent(budget, state.total_usage().values(), state.session_spent)


def exceeded(state: TurnState, estimated_input_tokens: int) -> str | None:
    """Why the next model call would pass the budget (``budget_math.exceeded``), or None; the
    call a person let through goes ahead whatever its estimate."""
    budget, limit = state.plan.budget, state.budget_limit
    if budget is None or limit is None or state.budget_passed == state.model_calls + 1:
        return None
    return budget_math.exceeded(budget, limit, spent(state), estimated_input_tokens)


def hold(state: TurnState, problem: str, now: datetime) -> PendingCall:
    """Hold the next model call for a person's decision on the budget."""
    budget = state.plan.budget
    assert budget is not None and state.budget_limit is not None
    # No tool call waits here (``pending_calls.hold``): the next model call does, under a
    # name and arguments of its own.
    pending = PendingCall(
        call_id=f"budget:{state.model_calls + 1}",
        name="budget",
        arguments={
            "spent": spent(state),
            "limit": state.budget_limit,
            "unit": budget.unit,
            "max_raise": budget.max_raise,
        },
        since=now,
        kind="budget",
        prompt=problem,
    )
    state.pending_approvals[pending.call_id] = pending
    return pending


def stop(state: TurnState, problem: str, record: DecisionRecord | None = None) -> None:
    """End the turn before its next model call, with a final assistant message saying why: the
    agent stops at its budget, or nobody (or a person) raised it."""
    budget = state.plan.budget
    why = "" if record is None else f" ({_stopped_by(record)})"
    text = f"Stopped at the budget: {problem}{why}."
    detail = {
        "spent": spent(state),
        "limit": state.budget_limit,
        "unit": budget.unit if budget else None,
    }
    state.end_with(
        Message(
            role="assistant",
            content=[TextContent(text=text)],
            channels={"budget": json_channel(detail)},
            stop_reason=StopReason.PAUSE,
        )
    )


class Budget(Wait):
    kind = "budget"

    def timeout(self, state: TurnState, pending: PendingCall) -> float:
        return state.plan.budget.timeout if state.plan.budget else 0.0

    def problem(self, state: TurnState, decision: Decision, pending: PendingCall) -> str | None:
        budget = state.plan.budget
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
        so_far = spent(state)
        limit = budget_math.amount(decision.limit, budget.unit)
        if decision.limit <= so_far:
            return (
                f"a limit of {limit} is not above what is spent "
                f"({budget_math.amount(so_far, budget.unit)})"
            )
        if budget.max_raise is not None and decision.limit > budget.max_raise:
            most = budget_math.amount(budget.max_raise, budget.unit)
            return (
                f"a limit of {limit} is above the most agent {state.plan.agent!r} allows ({most})"
            )
        return None

    def decide(
        self,
        state: TurnState,
        decision: Decision,
        pending: PendingCall,
        now: datetime,
        rule_id: str | None,
    ) -> DecisionRecord:
        """A raise lets the next model call through, whatever its estimate."""
        before = state.budget_limit or 0.0
        raised = decision.decision == "approve" and decision.limit is not None
        if raised and decision.limit is not None:
            state.budget_raised += decision.limit - before
            state.budget_limit = decision.limit
            state.budget_passed = state.model_calls + 1
        return pending_calls.record_decision(
            state,
            pending,
            decision,
            now,
            original_arguments={"limit": before} if raised else None,
            arguments={"limit": decision.limit} if raised else None,
        )

    def announce(self, turn: Turn, pending: PendingCall) -> None:
        """No tool call waits: the turn waits before its model call, and says why."""
        turn.show(f"waiting on a budget decision: {pending.prompt}", publish=True)
        worker_cache.leave_cache()

    def settled(self, turn: Turn) -> None:
        """What the turn does next (stop, or the model call) says the rest."""
        del turn


BUDGET = Budget()


async def within_budget(turn: Turn, request: LlmRequest, estimated_input_tokens: int) -> bool:
    """Whether the model call ``request`` (of about ``estimated_input_tokens`` input tokens)
    may go ahead under the turn's budget: at once, or
    once a person raised it. Otherwise the turn has stopped with a final message: the agent
    stops at its budget, or the person chose to, or nobody decided in time. The wait is an
    approval's: no activity runs, the turn leaves the worker's cache."""
    state = turn.state
    budget = state.plan.budget
    assert budget is not None
    problem = exceeded(state, estimated_input_tokens)
    if problem is None:
        return True
    if budget.on_exceeded == "stop":
        stop(state, problem)
        return False
    pending = hold(state, problem, workflow.now())
    record = await BUDGET.wait(turn, pending, visibility.clip(f"budget · {pending.call_id}"))
    if not record.approved:
        stop(state, problem, record)
        return False
    turn.show(visibility.waiting_on_model(request), publish=True)
    return True


def _stopped_by(record: DecisionRecord) -> str:
    if record.decision == "timeout":
        return record.reason or "no decision in time"
    said = f": {record.reason}" if record.reason else ""
    return f"{record.by} chose to stop{said}"
