"""What every kind of wait shares: the calls waiting for a decision (the turn's own and those its
child turns report), the decisions taken on them, and the "always allow" rules that spare a
call the wait."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from turnkeep.contract.activity_io import ToolCallRequest
from turnkeep.contract.approval import (
    AllowRule,
    Decided,
    Decision,
    DecisionRecord,
    PendingCall,
    WaitKind,
    allowed_by,
    revoke_problem,
    revoked,
)
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.tool_batch import covering

# -- waiting calls ----------------------------------------------------------------------------


def hold(state: TurnState, call: ToolCallRequest, now: datetime, **fields: Any) -> PendingCall:
    """Make ``call`` wait for a decision (``kinds.decide``, or its timeout), from ``now``
    (``fields``: what its kind adds or says otherwise, such as the id it waits under)."""
    pending = PendingCall.model_validate(
        {
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
            "since": now,
            **fields,
        }
    )
    state.pending_approvals[pending.call_id] = pending
    return pending


def awaits_decision(state: TurnState) -> bool:
    """Whether a call of the turn, or of one of its child turns, waits for a person."""
    return bool(state.pending_approvals) or any(state.descendant_approvals.values())


def waiting_calls(state: TurnState) -> list[PendingCall]:
    """The calls waiting for a decision: the turn's own, then its child turns'."""
    descendants = [c for calls in state.descendant_approvals.values() for c in calls]
    return [*state.pending_approvals.values(), *descendants]


def reported_calls(state: TurnState, turn_id: str) -> list[PendingCall]:
    """``waiting_calls`` as this turn, ``turn_id``, reports them to its parent turn: its own
    calls say whose they are."""
    own = [
        c.model_copy(update={"turn_id": turn_id, "agent": state.plan.agent})
        for c in state.pending_approvals.values()
    ]
    return [*own, *waiting_calls(state)[len(own) :]]


def call_owners(state: TurnState, call_id: str) -> list[str]:
    """The child turns (by id) in which a call ``call_id`` waits, unless it is the turn's own
    call."""
    if call_id in state.pending_approvals:
        return []
    owners = (
        c.turn_id
        for calls in state.descendant_approvals.values()
        for c in calls
        if c.call_id == call_id
    )
    return list(dict.fromkeys(o for o in owners if o is not None))


# -- decisions --------------------------------------------------------------------------------


def last_record(state: TurnState, call_id: str) -> DecisionRecord | None:
    """The last decision taken on ``call_id``, if any."""
    return next((r for r in reversed(state.decisions) if r.call_id == call_id), None)


def record(
    state: TurnState,
    *,
    call_id: str,
    tool: str,
    kind: WaitKind,
    decision: Decided,
    by: str,
    reason: str | None,
    at: datetime,
    **fields: Any,
) -> DecisionRecord:
    """Record what settled the wait ``call_id`` (a call of ``tool``, or what its server asked):
    a person's decision, a timeout, or the agent's config declining at once (``fields``: what
    the kind adds, such as edited arguments)."""
    taken = DecisionRecord(
        call_id=call_id,
        tool=tool,
        kind=kind,
        decision=decision,
        by=by,
        reason=reason,
        at=at,
        **fields,
    )
    state.decisions.append(taken)
    return taken


def record_decision(
    state: TurnState, pending: PendingCall, decision: Decision, now: datetime, **fields: Any
) -> DecisionRecord:
    """Record a person's ``decision`` on the waiting call ``pending`` (``fields``: what its kind
    adds or says otherwise)."""
    said = {"decision": decision.decision, "by": decision.by, "reason": decision.reason, **fields}
    return record(
        state, call_id=pending.call_id, tool=pending.name, kind=pending.kind, at=now, **said
    )


# -- always allow -----------------------------------------------------------------------------


def allow_waiting(state: TurnState, now: datetime) -> None:
    """Approve the waiting calls a rule now covers, as ``tool_batch.apply_rules`` would have."""
    for call in list(state.pending_approvals.values()):
        rule = covering(state.allow_rules, call.name, call.arguments)
        if call.kind != "approval" or rule is None:
            continue
        del state.pending_approvals[call.call_id]
        state.decisions.append(allowed_by(rule, call.call_id, call.name, now))


def revoke_rule_problem(state: TurnState, rule_id: str) -> str | None:
    """Why the turn's rule ``rule_id`` cannot be revoked, or None."""
    if state.done:
        return f"the turn has ended ({state.stop_reason}); its rules ended with it"
    return revoke_problem(state.allow_rules, rule_id, "this turn")


def revoke(state: TurnState, rule_id: str, by: str, now: datetime) -> AllowRule | None:
    """Revoke a rule (checked by ``revoke_rule_problem``; a session's revocation it relays may
    name one the turn does not have, which changes nothing): the calls it covered wait again."""
    for i, rule in enumerate(state.allow_rules):
        if rule.id == rule_id and rule.active:
            state.allow_rules[i] = revoked(rule, by, now)
            return state.allow_rules[i]
    return None
