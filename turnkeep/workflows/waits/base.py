"""The one interface a kind of wait implements (``kinds.KINDS`` lists them), the durable wait
its calls wait in, and what a wait needs of the workflow it waits in (``Turn``).

A wait is a ``PendingCall`` of its kind in ``TurnState.pending_approvals``, settled by the
``decide`` update (or its timeout): its kind says which decisions it takes, what taking one
does, and how long it waits. The defaults are those of a wait a person approves or denies."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Protocol

from temporalio import workflow

from turnkeep.contract.approval import (
    TIMEOUT_DECIDER,
    Decision,
    DecisionRecord,
    PendingCall,
    WaitKind,
    format_seconds,
)
from turnkeep.contract.model_io import LlmRequest
from turnkeep.workflows import pending_calls, turn_metrics
from turnkeep.workflows.loop import TurnState

NO_LIMIT = "a limit goes only with a budget's wait"


@dataclass
class ServerRequestsInFlight:
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


class Turn(Protocol):
    """What a wait needs of the workflow it waits in (``TurnWorkflow``)."""

    # What its tools' servers asked during their calls.
    requests_in_flight: ServerRequestsInFlight

    @property
    def state(self) -> TurnState: ...

    def drop_message_json(self) -> None:
        """Let go of the JSON of the conversation's messages (kept between model calls to
        dump only what is new): a person may take hours, and the next call dumps it again."""

    def show(self, doing: str, *, publish: bool = False) -> None:
        """Say in the current details (and with ``publish``, the search attributes) what the
        turn is doing."""

    def tools_moved(self, *, publish: bool = False) -> None:
        """A call of the tool batch began to wait, was decided or ended."""


class Wait(ABC):
    """One kind of wait (``kind``: the ``PendingCall.kind`` of its calls)."""

    kind: ClassVar[WaitKind]
    # What a decision may carry besides approve or deny, by kind: edited arguments and an
    # "always allow" rule (a tool call's approval), and an answer's content (an elicitation).
    takes_edits: ClassVar[bool] = False
    takes_remember: ClassVar[bool] = False
    takes_content: ClassVar[bool] = False

    @abstractmethod
    def timeout(self, state: TurnState, pending: PendingCall) -> float:
        """Seconds ``pending`` waits for a decision."""

    def problem(self, state: TurnState, decision: Decision, pending: PendingCall) -> str | None:
        """Why ``decision`` cannot settle ``pending``, or None: the ``decide`` update's
        validator refuses it with this text and the turn goes on unaffected."""
        kind, call = pending.kind, pending.call_id
        if decision.limit is not None:
            return NO_LIMIT
        if decision.result is not None:
            return (
                f"call {call!r} ({pending.name}) is not a client-side tool's: it is approved or "
                "denied, not given a result"
            )
        if decision.arguments is not None and not self.takes_edits:
            return f"arguments (an edit) go only with a tool call's approval, not {kind}"
        if decision.arguments is not None and decision.decision != "approve":
            return "arguments (an edit) go only with an approval"
        if decision.remember is not None and decision.decision != "approve":
            return "remember (always allow) goes only with an approval"
        if decision.remember is not None and not self.takes_remember:
            return f"remember (always allow) goes only with a tool call's approval, not {kind}"
        if decision.remember_arguments and decision.remember is None:
            return "remember_arguments goes only with remember"
        if decision.remember == "session" and not state.in_session:
            return "remember: session needs a session's turn; this turn is no session's"
        if (decision.content is not None or decision.cancel) and not self.takes_content:
            return f"content and cancel answer an elicitation; {call!r} waits for {kind}"
        return None

    def decide(
        self,
        state: TurnState,
        decision: Decision,
        pending: PendingCall,
        now: datetime,
        rule_id: str | None,
    ) -> DecisionRecord:
        """Take ``decision`` (checked by ``problem``) on ``pending``, no longer waiting;
        ``rule_id``: the id of the rule a remembered decision sets."""
        del rule_id
        return pending_calls.record_decision(state, pending, decision, now)

    def after_timeout(self, state: TurnState, pending: PendingCall) -> None:
        """Nobody decided on ``pending`` (no longer waiting) in time: what follows, besides the
        record of the timeout."""
        del state, pending

    def time_out(self, state: TurnState, call_id: str, now: datetime) -> DecisionRecord:
        """Settle the wait ``call_id`` nobody decided on in time: its record says so (a call is
        then answered with a denial; after a budget's, ``within_budget`` stops the turn)."""
        pending = state.pending_approvals.pop(call_id)
        timeout = self.timeout(state, pending)
        self.after_timeout(state, pending)
        return pending_calls.record(
            state,
            call_id=call_id,
            tool=pending.name,
            kind=pending.kind,
            decision="timeout",
            by=TIMEOUT_DECIDER,
            reason=f"no decision within {format_seconds(timeout)}",
            at=now,
        )

    def announce(self, turn: Turn, pending: PendingCall) -> None:
        """Show that ``pending`` now waits, and let the worker drop the turn from its cache
        once only people are awaited."""
        del pending
        # Published at once, whatever the interval: an operator's query for turns awaiting
        # approval must find this one now.
        turn.tools_moved(publish=True)

    def settled(self, turn: Turn) -> None:
        """Show that the wait is over (decided, or timed out)."""
        turn.tools_moved(publish=True)

    async def wait(self, turn: Turn, pending: PendingCall, summary: str) -> DecisionRecord:
        """Wait until ``pending`` (a call, or what a call's server asked, held already) is
        decided, or its ``timeout`` passes (the timer's ``summary``). A durable wait in the workflow
        itself: no activity runs and no worker slot is held, the worker lets the turn go from
        its cache while only people are awaited (``tools_moved``), and a worker or server
        restart replays to this same wait."""
        state, wait_id = turn.state, pending.call_id
        turn.drop_message_json()
        turn_metrics.approval_requested(state.plan.agent)
        self.announce(turn, pending)
        try:
            await workflow.wait_condition(
                lambda: wait_id not in state.pending_approvals,
                timeout=self.timeout(state, pending),
                timeout_summary=summary,
            )
        except TimeoutError:
            if wait_id in state.pending_approvals:  # not decided in this same task
                self.time_out(state, wait_id, workflow.now())
        except asyncio.CancelledError:
            turn_metrics.approval_resolved(state.plan.agent, "cancelled")
            raise
        self.settled(turn)
        record = pending_calls.last_record(state, wait_id)
        assert record is not None
        turn_metrics.approval_resolved(state.plan.agent, record.decision)
        return record
