"""A call of a client-side tool, waiting for its client to submit the result (or deny it)."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow

from turnkeep.contract.activity_io import ToolCallRequest
from turnkeep.contract.approval import Decision, DecisionRecord, PendingCall, result_problem
from turnkeep.contract.messages import CallToolResult
from turnkeep.workflows import pending_calls, visibility
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits.base import NO_LIMIT, Turn, Wait


def hold(state: TurnState, call: ToolCallRequest, now: datetime) -> PendingCall:
    """Hold a call of a client-side tool until a client submits its result."""
    tool = state.plan.client_tool(call.name)
    assert tool is not None, "only calls of client-side tools wait for a client"
    return pending_calls.hold(
        state, call, now, kind="client_result", requested_schema=tool.output_schema
    )


class ClientResult(Wait):
    kind = "client_result"

    def timeout(self, state: TurnState, pending: PendingCall) -> float:
        assert state.plan.client_tools is not None, "only client-side calls wait for a client"
        return state.plan.client_tools.timeout

    def problem(self, state: TurnState, decision: Decision, pending: PendingCall) -> str | None:
        call = pending.call_id
        if decision.limit is not None:
            return NO_LIMIT
        if decision.arguments is not None:
            return f"call {call!r} is a client-side tool's: it takes a result, not arguments"
        if decision.remember is not None or decision.remember_arguments:
            return f"call {call!r} is a client-side tool's: its client answers each call"
        if decision.content is not None or decision.cancel:
            return "content and cancel answer an elicitation, not a client-side tool's call"
        if decision.decision == "deny":
            return "a denial takes no result" if decision.result is not None else None
        if decision.result is None:
            return f"call {call!r} ({pending.name}) waits for its result: submit one"
        return result_problem(decision.result, pending.requested_schema)

    def decide(
        self,
        state: TurnState,
        decision: Decision,
        pending: PendingCall,
        now: datetime,
        rule_id: str | None,
    ) -> DecisionRecord:
        """A result submitted waits in ``state.submitted`` for the waiting call to take it."""
        if decision.result is not None and decision.decision == "approve":
            state.submitted[pending.call_id] = decision.result.as_result()
        return super().decide(state, decision, pending, now, rule_id)


CLIENT_RESULT = ClientResult()


async def result(turn: Turn, call: ToolCallRequest) -> CallToolResult:
    """Hold a client-side tool's call until a client submits its result through ``decide`` (or
    denies it, or the timeout does): the same durable wait as an approval's."""
    state = turn.state
    assert state.plan.client_tools is not None, "only client-side calls wait for a client"
    pending = hold(state, call, workflow.now())
    record = await CLIENT_RESULT.wait(turn, pending, visibility.approval_timeout_summary(call))
    submitted = state.submitted.pop(call.call_id, None)
    return submitted if record.approved and submitted is not None else record.denial()
