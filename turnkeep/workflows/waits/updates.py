"""The updates and signals that settle or change what a turn waits for, as ``TurnWorkflow``'s
handlers delegate them: each takes its arguments as they come (a typed parameter would turn a
wrong count into a failed workflow task) and the validators refuse what cannot be taken, with
the turn unaffected."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from turnkeep.contract.approval import (
    DECIDED_IN_CHILD,
    AllowRule,
    Decision,
    DecisionRecord,
    RevokeAllow,
)
from turnkeep.workflows import pending_calls
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.starting import handler_argument
from turnkeep.workflows.waits import kinds

# The error type a refused decision (or revocation) carries.
DECISION_ERROR = "InvalidDecision"


def decide(state: TurnState, args: Sequence[Any]) -> DecisionRecord:
    """The ``decide`` update: one argument, a ``Decision`` (checked by ``check_decide``)."""
    decision = Decision.model_validate(args[0])
    # Drawn only by a decision that sets a rule: no other turn's replay sees it.
    rule_id = f"rule-{workflow.uuid4().hex[:12]}" if decision.remember else None
    return kinds.decide(state, decision, workflow.now(), rule_id)


def check_decide(state: TurnState | None, args: Sequence[Any]) -> None:
    """Refuse a decision that cannot be taken now (``kinds.decision_problem``), or that is
    for a call waiting in a child turn, naming that turn."""
    decision = handler_argument(args, Decision, "decide", DECISION_ERROR)
    if state is None:
        raise _bad_decision("the turn has not reached its tool calls yet")
    _route_to_child(pending_calls.call_owners(state, decision.call_id), decision.call_id)
    # A result is checked against its tool's output schema by jsonschema, which is not
    # workflow code: imported outside the sandbox, once per worker.
    with workflow.unsafe.imports_passed_through():
        problem = kinds.decision_problem(state, decision)
    if problem is not None:
        raise _bad_decision(problem)


def revoke_allow(state: TurnState, args: Sequence[Any]) -> AllowRule:
    """The ``revoke_allow`` update: one argument, a ``RevokeAllow`` (checked by
    ``check_revoke_allow``)."""
    revoke = RevokeAllow.model_validate(args[0])
    rule = pending_calls.revoke(state, revoke.rule_id, revoke.by, workflow.now())
    assert rule is not None
    return rule


def check_revoke_allow(state: TurnState | None, args: Sequence[Any]) -> None:
    """Refuse a revocation of a rule the turn does not have, or has revoked already."""
    revoke = handler_argument(args, RevokeAllow, "revoke_allow", DECISION_ERROR)
    problem = (
        "the turn has no rules yet"
        if state is None
        else pending_calls.revoke_rule_problem(state, revoke.rule_id)
    )
    if problem is not None:
        raise _bad_decision(problem)


def session_rule_revoked(state: TurnState | None, args: Sequence[Any]) -> None:
    """The ``session_rule_revoked`` signal: one argument, a ``RevokeAllow``. A signal cannot be
    refused, and any client may send one: it can only make calls wait for a person again, never
    let one run."""
    try:
        revoke = RevokeAllow.model_validate(args[0] if len(args) == 1 else None)
    except ValidationError as err:
        workflow.logger.warning("ignored a session_rule_revoked signal: %s", err)
        return
    if state is not None and not state.done:
        pending_calls.revoke(state, revoke.rule_id, revoke.by, workflow.now())


def _route_to_child(owners: list[str], call_id: str) -> None:
    """Refuse a decision on a call waiting in a child turn (``owners``: those in which a call
    with this id waits), naming the turn the client is to send it to: the child's own validator
    then takes it, on what the child knows rather than on its last report."""
    if len(owners) == 1:
        raise ApplicationError(
            f"call {call_id!r} waits in child turn {owners[0]!r}: decide it there",
            owners[0],
            type=DECIDED_IN_CHILD,
            non_retryable=True,
        )
    if owners:
        raise _bad_decision(
            f"a call {call_id!r} waits in each of the child turns {', '.join(owners)}: send "
            "the decision to the one it is for"
        )


def _bad_decision(message: str) -> ApplicationError:
    return ApplicationError(message, type=DECISION_ERROR, non_retryable=True)
