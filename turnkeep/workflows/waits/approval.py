"""A tool call the agent's approval rules hold until a person approves (perhaps with edited
arguments, perhaps always) or denies it."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow

from turnkeep.contract.activity_io import ToolCallRequest
from turnkeep.contract.approval import AllowRule, Decision, DecisionRecord, PendingCall
from turnkeep.contract.messages import CallToolResult
from turnkeep.workflows import pending_calls, visibility
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits.base import Turn, Wait


def hold(state: TurnState, call: ToolCallRequest, now: datetime) -> PendingCall:
    """Hold ``call`` for a person's decision."""
    return pending_calls.hold(state, call, now)


class Approval(Wait):
    kind = "approval"
    takes_edits = True
    takes_remember = True

    def timeout(self, state: TurnState, pending: PendingCall) -> float:
        return state.plan.approval.timeout if state.plan.approval else 0.0

    def decide(
        self,
        state: TurnState,
        decision: Decision,
        pending: PendingCall,
        now: datetime,
        rule_id: str | None,
    ) -> DecisionRecord:
        """One that remembers also sets an "always allow" rule, which allows at once the
        batch's other waiting calls it covers."""
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
            state.allow_rules.append(rule)
        record = pending_calls.record_decision(
            state,
            pending,
            decision,
            now,
            original_arguments=pending.arguments if edited else None,
            arguments=decision.arguments if edited else None,
            rule=rule.id if rule else None,
            remember=decision.remember,
        )
        if rule is not None:
            pending_calls.allow_waiting(state, now)
        return record


APPROVAL = Approval()


async def approve(turn: Turn, call: ToolCallRequest) -> ToolCallRequest | CallToolResult:
    """Hold ``call`` until the ``decide`` update (or the agent's timeout) settles it: the call
    to run (perhaps with edited arguments), or the denial to answer it with."""
    state = turn.state
    assert state.plan.approval is not None, "only calls the approval rules name are gated"
    pending = hold(state, call, workflow.now())
    record = await APPROVAL.wait(turn, pending, visibility.approval_timeout_summary(call))
    if not record.approved:
        return record.denial()
    if record.arguments is not None:
        return call.model_copy(update={"arguments": record.arguments})
    return call
