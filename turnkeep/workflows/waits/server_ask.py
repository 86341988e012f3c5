"""What a tool's server asks a person during the call (an MCP elicitation, or a sampling request
its config has a person approve): the call waits under a wait id of its own, and runs again
with the answer (``server_requests``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from temporalio import workflow

from turnkeep.contract.activity_io import TOOL_SEPARATOR, ToolCallRequest
from turnkeep.contract.approval import Decision, DecisionRecord, PendingCall
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.server_requests import SERVER_POLICY_DECIDER, ServerRequest
from turnkeep.workflows import pending_calls, visibility
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits.base import Turn, Wait

# Seconds a server's request waits for a person when neither the server nor the agent's
# approval rules say.
DEFAULT_INPUT_TIMEOUT = 86400.0


@dataclass
class ServerAsks:
    """What the workflow keeps of its servers' requests while it runs. Never carried over: a
    run continues as new only between steps, with no tool call running."""

    # The tool calls whose server's request waits for a person, by wait id; and the requests
    # of the model calls made for servers' sampling requests, by call index.
    waiting: dict[str, str] = field(default_factory=dict)
    sampling_inputs: dict[int, LlmRequest] = field(default_factory=dict)
    # Per tool call, how many of its server's requests were numbered, and the declined ones
    # already recorded (by digest).
    numbered: dict[str, int] = field(default_factory=dict)
    declined: set[tuple[str, str]] = field(default_factory=set)

    def next_number(self, call_id: str) -> int:
        """The number of a server's next request in call ``call_id`` (1, 2...)."""
        self.numbered[call_id] = self.numbered.get(call_id, 0) + 1
        return self.numbered[call_id]


class AskedTurn(Turn, Protocol):
    """A turn whose tools' servers may ask during their calls."""

    asks: ServerAsks


def hold(
    state: TurnState, call: ToolCallRequest, wait_id: str, request: ServerRequest, now: datetime
) -> None:
    """Hold ``call`` while a person answers what its server asked (``request``), under
    ``wait_id``."""
    pending_calls.hold(
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
        return pending_calls.record(state, pending, decision, now, reason=reason)

    def answer(
        self, state: TurnState, pending: PendingCall, decision: Decision, request: ServerRequest
    ) -> str | None:
        """What the server is answered, in ``state.server_answers`` for the call's next run to
        take; the reason the record gives."""
        del state, pending, request
        return decision.reason

    def timed_out(self, state: TurnState, pending: PendingCall) -> None:
        state.server_asks.pop(pending.call_id)

    async def ask(
        self, turn: AskedTurn, call: ToolCallRequest, wait_id: str, request: ServerRequest
    ) -> None:
        """Hold ``call`` under ``wait_id`` until a person answers ``request`` (the ``decide``
        update) or its timeout passes: the same durable wait as an approval's."""
        assert request.kind == self.kind, "a request waits as its own kind"
        state = turn.state
        hold(state, call, wait_id, request, workflow.now())
        turn.asks.waiting[wait_id] = call.call_id
        try:
            summary = visibility.clip(f"{request.kind} {call.name} · {wait_id}")
            await self.wait(turn, wait_id, input_timeout(state, call.name), summary)
        finally:
            del turn.asks.waiting[wait_id]
