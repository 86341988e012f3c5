"""The one interface a kind of wait implements (``decisions.KINDS`` lists them).

A wait is a ``PendingCall`` of its kind in ``TurnState.pending_approvals``, settled by the
``decide`` update (or its timeout): its kind says which decisions it takes, what taking one
does, and how long it waits. The defaults are those of a wait a person approves or denies."""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime
from typing import ClassVar

from turnkeep.contract.approval import Decision, DecisionRecord, PendingCall, WaitKind
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits import pending as waits

NO_LIMIT = "a limit goes only with a budget's wait"


class Wait(ABC):
    """One kind of wait (``kind``: the ``PendingCall.kind`` of its calls)."""

    kind: ClassVar[WaitKind]

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
        if decision.remember == "session" and not state.in_session:
            return "remember: session needs a session's turn; this turn is no session's"
        if (decision.content is not None or decision.cancel) and kind != "elicitation":
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
        return waits.record(state, pending, decision, now)

    def timed_out(self, state: TurnState, pending: PendingCall) -> None:
        """Nobody decided on ``pending`` (no longer waiting) in time: what follows, besides the
        record of the timeout."""
        del state, pending
