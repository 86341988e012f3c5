"""What a tool's server asks a person during the call (an MCP elicitation, or a sampling request
its config has a person approve): the call waits under a wait id of its own, and runs again
with the answer (``server_requests``)."""

from __future__ import annotations

from datetime import datetime

from turnkeep.contract.activity_io import TOOL_SEPARATOR, ToolCallRequest
from turnkeep.contract.approval import Decision, DecisionRecord, PendingCall
from turnkeep.contract.server_requests import SERVER_POLICY_DECIDER, ServerRequest
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits import pending as waits
from turnkeep.workflows.waits.base import Wait

# Seconds a server's request waits for a person when neither the server nor the agent's
# approval rules say.
DEFAULT_INPUT_TIMEOUT = 86400.0


def hold(
    state: TurnState, call: ToolCallRequest, wait_id: str, request: ServerRequest, now: datetime
) -> None:
    """Hold ``call`` while a person answers what its server asked (``request``), under
    ``wait_id``."""
    waits.hold(
        state,
        PendingCall(
            call_id=wait_id,
            name=call.name,
            arguments=call.arguments,
            since=now,
            kind=request.kind,
            prompt=request.prompt(),
            requested_schema=request.requested_schema,
        ),
    )
    state.server_asks[wait_id] = request


def decline(
    state: TurnState, call: ToolCallRequest, wait_id: str, request: ServerRequest, now: datetime
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
    state.decisions.append(record)
    return record


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
        reason = self.answer(state, pending, decision, request)
        return waits.record(state, pending, decision, now, reason=reason)

    def answer(
        self, state: TurnState, pending: PendingCall, decision: Decision, request: ServerRequest
    ) -> str | None:
        """What the server is answered, in ``state.server_answers`` for the call's next run to
        take; the reason the record gives."""
        del state, pending, request
        return decision.reason

    def timed_out(self, state: TurnState, pending: PendingCall) -> None:
        state.server_asks.pop(pending.call_id)
