"""A batch of tool calls: one assistant message's calls split into those that run now, those
answered at once (an unknown tool, arguments that are not an object), those held for a
decision and those a client answers (client-side tools); and the batch once the agent's
approval policy, then the turn's "always allow" rules, have screened its held calls."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from turnkeep.contract.activity_io import ToolCallRequest
from turnkeep.contract.approval import (
    NO_REASON,
    AllowRule,
    ApprovalPlan,
    DecisionRecord,
    PolicyCall,
    PolicyDecision,
    PolicyRequest,
    PolicyVerdicts,
    allowed_by,
    policy_decider,
)
from turnkeep.contract.messages import CallToolResult


class ToolBatch(BaseModel):
    """The tool calls of one assistant message, split into what runs and what is answered now."""

    to_run: list[ToolCallRequest]
    answered: dict[str, CallToolResult]  # unknown tool, invalid arguments
    # Calls the agent's approval rules hold until a person decides (or the timeout passes).
    gated: list[ToolCallRequest] = Field(default_factory=list)
    # Calls of client-side tools: they wait for a client to submit their results.
    client: list[ToolCallRequest] = Field(default_factory=list)


def policy_request(plan: ApprovalPlan, agent: str, calls: list[ToolCallRequest]) -> PolicyRequest:
    assert plan.policy is not None, "only an agent with a policy puts calls to one"
    return PolicyRequest(
        agent=agent,
        policy=plan.policy,
        calls=[PolicyCall(call_id=c.call_id, name=c.name, arguments=c.arguments) for c in calls],
    )


def apply_verdicts(
    batch: ToolBatch,
    plan: ApprovalPlan,
    verdicts: PolicyVerdicts,
    order: list[str],
    now: datetime,
) -> tuple[ToolBatch, list[DecisionRecord]]:
    """``batch`` once the policy has decided on its held calls, and the records of what it
    decided: allowed calls run with the others (in the model's ``order`` of call ids), denied
    ones are answered with the denial, and those it asks about (or left out) stay held for a
    person."""
    assert plan.policy is not None
    allowed: list[ToolCallRequest] = []
    asked: list[ToolCallRequest] = []
    answered = dict(batch.answered)
    records: list[DecisionRecord] = []
    for call in batch.gated:
        verdict = verdicts.decisions.get(call.call_id, PolicyDecision(action="ask"))
        if verdict.action == "ask":
            asked.append(call)
            continue
        record = DecisionRecord(
            call_id=call.call_id,
            tool=call.name,
            decision="approve" if verdict.action == "allow" else "deny",
            by=policy_decider(plan.policy),
            reason=verdict.reason,
            at=now,
        )
        records.append(record)
        if record.approved:
            allowed.append(call)
        else:
            answered[call.call_id] = CallToolResult.error(
                f"Tool call denied by policy {plan.policy}: {verdict.reason or NO_REASON}"
            )
    to_run = _in_order([*batch.to_run, *allowed], order)
    screened = batch.model_copy(update={"to_run": to_run, "gated": asked, "answered": answered})
    return screened, records


def apply_rules(
    batch: ToolBatch, rules: list[AllowRule], order: list[str], now: datetime
) -> tuple[ToolBatch, list[DecisionRecord]]:
    """``batch`` once the turn's "always allow" rules have let the held calls they cover run
    (in the model's ``order``), and the records of each, approved by ``rule:<who set it>``.
    Applied after the policy: a rule only spares a person's wait, never a policy's denial."""
    allowed: list[ToolCallRequest] = []
    held: list[ToolCallRequest] = []
    records: list[DecisionRecord] = []
    for call in batch.gated:
        rule = covering(rules, call.name, call.arguments)
        if rule is None:
            held.append(call)
            continue
        allowed.append(call)
        records.append(allowed_by(rule, call.call_id, call.name, now))
    to_run = _in_order([*batch.to_run, *allowed], order)
    return batch.model_copy(update={"to_run": to_run, "gated": held}), records


def covering(rules: list[AllowRule], tool: str, arguments: dict[str, Any]) -> AllowRule | None:
    """The first active rule that allows a call of ``tool`` with ``arguments``, if any."""
    return next((r for r in rules if r.covers(tool, arguments)), None)


def _in_order(calls: list[ToolCallRequest], order: list[str]) -> list[ToolCallRequest]:
    position = {call_id: i for i, call_id in enumerate(order)}
    return sorted(calls, key=lambda call: position.get(call.call_id, 0))
