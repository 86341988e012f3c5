"""The kinds of wait (``KINDS``: a new kind of wait is one module and one entry here), and the
``decide`` update's check and decision, each handed to the kind of what it settles."""

from __future__ import annotations

from datetime import datetime

from turnkeep.contract.approval import Decision, DecisionRecord, WaitKind
from turnkeep.workflows import pending_calls
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits.approval import APPROVAL
from turnkeep.workflows.waits.base import Wait
from turnkeep.workflows.waits.budget_raise import BUDGET
from turnkeep.workflows.waits.client_tool import CLIENT_RESULT
from turnkeep.workflows.waits.elicitation import ELICITATION
from turnkeep.workflows.waits.sampling import SAMPLING

KINDS: dict[WaitKind, Wait] = {
    wait.kind: wait for wait in (APPROVAL, BUDGET, CLIENT_RESULT, ELICITATION, SAMPLING)
}


def decision_problem(state: TurnState, decision: Decision) -> str | None:
    """Why ``decision`` cannot be taken now, or None: the update's validator refuses it with
    this text and the turn goes on unaffected."""
    call = decision.call_id
    if state.done:
        return f"the turn has ended ({state.stop_reason}); no call waits for a decision"
    if call not in state.pending_approvals and pending_calls.last_record(state, call) is not None:
        return f"call {call!r} has already been decided"
    if call not in state.pending_approvals:
        waiting = ", ".join(sorted(state.pending_approvals)) or "none"
        return f"no call {call!r} is waiting for approval (waiting: {waiting})"
    pending = state.pending_approvals[call]
    return KINDS[pending.kind].problem(state, decision, pending)


def decide(
    state: TurnState, decision: Decision, now: datetime, rule_id: str | None = None
) -> DecisionRecord:
    """Record a person's decision on a waiting call (checked by ``decision_problem``);
    ``rule_id``: the id of the rule a remembered decision sets."""
    pending = state.pending_approvals.pop(decision.call_id)
    return KINDS[pending.kind].decide(state, decision, pending, now, rule_id)
