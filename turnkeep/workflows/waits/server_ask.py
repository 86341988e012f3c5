"""What a tool's server asks a person during the call (an MCP elicitation, or a sampling request
its config has a person approve): the call waits under a wait id of its own, and runs again
with the answer (``server_answers``)."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow

from turnkeep.contract.activity_io import TOOL_SEPARATOR, ToolCallRequest
from turnkeep.contract.approval import Decision, DecisionRecord, PendingCall
from turnkeep.contract.server_requests import SERVER_POLICY_DECIDER, ServerAnswer, ServerRequest
from turnkeep.workflows import pending_calls, visibility
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits.base import Turn, Wait

# Seconds a server's request waits for a person when neither the server nor the agent's
# approval rules say.
DEFAULT_INPUT_TIMEOUT = 86400.0


def hold(
    state: TurnState, call: ToolCallRequest, wait_id: str, request: ServerRequest, now: datetime
) -> PendingCall:
    """Hold ``call`` while a person answers what its server asked (``request``), under
    ``wait_id``."""
    pending = pending_calls.hold(
        state,
        call,
        now,
        call_id=wait_id,
        kind=request.kind,
        prompt=request.prompt(),
        requested_schema=request.requested_schema,
    )
    state.server_asks[wait_id] = request
    return pending


def decline(
    state: TurnState, call: ToolCallRequest, wait_id: str, request: ServerRequest, now: datetime
) -> DecisionRecord:
    """Record a request the agent's config declined (or cancelled) at once."""
    return pending_calls.record(
        state,
        call_id=wait_id,
        tool=call.name,
        kind=request.kind,
        decision="deny",
        by=SERVER_POLICY_DECIDER,
        reason=request.reason or f"{request.kind} is not enabled for this server",
        at=now,
    )


def input_timeout(state: TurnState, tool: str) -> float:
    """Seconds what a server of ``tool`` asks may wait for a person: the server's own timeout,
    else the agent's approval timeout, else a day."""
    server = state.plan.server_requests.get(tool.partition(TOOL_SEPARATOR)[0])
    if server is not None and server.elicitation_timeout is not None:
        return server.elicitation_timeout
    return state.plan.approval.timeout if state.plan.approval else DEFAULT_INPUT_TIMEOUT


class ServerAsk(Wait):
    """What a server asked: settled, its request is no longer waited on."""

    def timeout(self, state: TurnState, pending: PendingCall) -> float:
        return input_timeout(state, pending.name)

    def decide(
        self,
        state: TurnState,
        decision: Decision,
        pending: PendingCall,
        now: datetime,
        rule_id: str | None,
    ) -> DecisionRecord:
        request = state.server_asks.pop(pending.call_id)
        answer = self.server_answer(decision, pending, request)
        if answer is not None:
            state.server_answers[pending.call_id] = answer
        return pending_calls.record_decision(
            state, pending, decision, now, reason=self.reason(decision)
        )

    def server_answer(
        self, decision: Decision, pending: PendingCall, request: ServerRequest
    ) -> ServerAnswer | None:
        """What ``decision`` answers the server, kept in ``state.server_answers`` for the
        call's next run to take; None: the workflow answers it itself (a sampling request's
        model call)."""
        del decision, pending, request
        return None

    def reason(self, decision: Decision) -> str | None:
        """The reason the decision's record gives."""
        return decision.reason

    def after_timeout(self, state: TurnState, pending: PendingCall) -> None:
        state.server_asks.pop(pending.call_id)

    async def ask(
        self, turn: Turn, call: ToolCallRequest, wait_id: str, request: ServerRequest
    ) -> None:
        """Hold ``call`` under ``wait_id`` until a person answers ``request`` (the ``decide``
        update) or its timeout passes: the same durable wait as an approval's."""
        assert request.kind == self.kind, "a request waits as its own kind"
        pending = hold(turn.state, call, wait_id, request, workflow.now())
        turn.requests_in_flight.waiting[wait_id] = call.call_id
        try:
            summary = visibility.clip(f"{request.kind} {call.name} · {wait_id}")
            await self.wait(turn, pending, summary)
        finally:
            del turn.requests_in_flight.waiting[wait_id]
