"""The ``approval_policy`` activity: an agent's approval policy, a Python callable registered on
the worker by name, deciding on each held tool call of a batch from its arguments: allow, deny,
or ask a person (``turnkeep.contract.approval``).

Policies are registered by ``TurnkeepPlugin(approval_policies=...)`` / ``build_worker``, as
``approval_policies:`` import paths in turnkeep.yaml, as functions on a Python ``Agent``'s
``approval``, or by installed packages in the ``turnkeep.approval_policies`` entry-point group.
A policy runs as an activity because it is user code (not deterministic, may do I/O); a policy
that raises is retried, and one that still fails, or answers something that is not a decision,
denies the calls (the workflow's doing: ``POLICY_FAILED_REASON``), never allows them.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnkeep.config.catalog import AgentCatalog
from turnkeep.contract.activity_io import TOOL_SEPARATOR
from turnkeep.contract.approval import (
    APPROVAL_POLICY,
    ApprovalPlan,
    ApprovalPolicy,
    ApprovalRequest,
    PolicyCall,
    PolicyDecision,
    PolicyRequest,
    PolicyVerdicts,
)
from turnkeep.errors import config_error, known, require_workflow

ENTRY_POINT_GROUP = "turnkeep.approval_policies"


class ApprovalPolicyActivities:
    def __init__(self, agents: AgentCatalog, policies: Mapping[str, ApprovalPolicy]) -> None:
        self._agents = agents
        self._policies = dict(policies)

    @activity.defn(name=APPROVAL_POLICY)
    async def approval_policy(self, request: PolicyRequest) -> PolicyVerdicts:
        require_workflow()
        rules = self._agents.agent(request.agent).approval
        # A policy may do anything its code does: run only the one the named agent configures,
        # and only on calls its rules put to it.
        if rules is None or rules.policy != request.policy:
            configured = rules.policy if rules is not None else None
            raise config_error(
                "PolicyNotConfigured",
                f"Agent {request.agent!r} does not use approval policy {request.policy!r} "
                f"(its policy: {configured or 'none'}).",
            )
        scope = ApprovalPlan(tools=rules.tools, timeout=rules.timeout, policy=rules.policy)
        outside = [call.name for call in request.calls if not scope.needs_approval(call.name)]
        if outside:
            raise config_error(
                "PolicyNotConfigured",
                f"Agent {request.agent!r} does not put calls of {known(set(outside))} to its "
                f"approval policy (its rules: {known(rules.tools)}).",
            )
        policy = self._policies.get(request.policy)
        if policy is None:  # the plugin refuses to start without it: a worker of another build
            raise config_error(
                "UnknownApprovalPolicy",
                f"Approval policy {request.policy!r} is not registered on this worker "
                f"(registered: {known(self._policies)}).",
            )
        workflow_id = activity.info().workflow_id or ""
        decisions: dict[str, PolicyDecision] = {}
        # One call after the other: a policy with side effects (a counter, an audit log) sees
        # the calls in the model's order, and need not be thread-safe.
        for call in request.calls:
            decisions[call.call_id] = await _decide(
                policy, request.policy, _approval_request(request.agent, workflow_id, call)
            )
        return PolicyVerdicts(decisions=decisions)


def _approval_request(agent: str, workflow_id: str, call: PolicyCall) -> ApprovalRequest:
    server, _, tool = call.name.partition(TOOL_SEPARATOR)
    return ApprovalRequest(
        agent=agent,
        workflow_id=workflow_id,
        call_id=call.call_id,
        name=call.name,
        server=server,
        tool=tool,
        arguments=call.arguments,
    )


async def _decide(policy: ApprovalPolicy, name: str, call: ApprovalRequest) -> PolicyDecision:
    if inspect.iscoroutinefunction(policy):
        answer = await policy(call)
    else:
        # A plain function may block (a lookup, a file): keep it off the event loop that every
        # other activity on this worker shares. A sync function returning an awaitable (a
        # functools.partial of a coroutine function) is awaited too.
        answer = await asyncio.to_thread(policy, call)
        if inspect.isawaitable(answer):
            answer = await answer
    return _decision(answer, name)


def _decision(answer: Any, name: str) -> PolicyDecision:
    """A policy's answer as a decision. Anything else is a bug in the policy that retrying
    cannot fix: refused at once (and the workflow denies the calls)."""
    if isinstance(answer, PolicyDecision):
        return answer
    try:
        if isinstance(answer, str):
            return PolicyDecision.model_validate({"action": answer})
        if isinstance(answer, Mapping):
            return PolicyDecision.model_validate(answer)
    except ValidationError:
        pass
    # The answer itself is left out: it could quote the call's arguments.
    raise ApplicationError(
        f"Approval policy {name!r} answered a {type(answer).__name__}, not a decision: answer "
        '"allow", "deny" or "ask", or a PolicyDecision(action=..., reason=...).',
        type="BadPolicyAnswer",
        non_retryable=True,
    )


def load_policies(
    agents: AgentCatalog, registered: Mapping[str, ApprovalPolicy]
) -> dict[str, ApprovalPolicy]:
    """``registered`` with the policies the agents name that only an installed package's
    ``turnkeep.approval_policies`` entry point provides (loaded only when named, so a broken
    package nobody uses cannot stop the worker). A name no one provides stops the worker."""
    policies = dict(registered)
    wanted = agents.approval_policies()
    missing = {policy: agent for policy, agent in wanted.items() if policy not in policies}
    if missing:
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            if entry.name in missing and entry.name not in policies:
                try:
                    loaded = entry.load()
                except Exception as err:
                    raise ValueError(
                        f"approval policy entry point {entry.name!r} ({entry.value}) of group "
                        f"{ENTRY_POINT_GROUP!r} could not be loaded: {err}"
                    ) from err
                if not callable(loaded):
                    raise ValueError(
                        f"approval policy entry point {entry.name!r} ({entry.value}) is not "
                        "callable"
                    )
                policies[entry.name] = loaded
    for policy, agent in wanted.items():
        if policy not in policies:
            raise ValueError(
                f"agent {agent!r} names approval policy {policy!r}, which is not registered "
                f"(known: {known(policies)}); register it with approval_policies in "
                f"turnkeep.yaml, TurnkeepPlugin(approval_policies=...) or the "
                f"{ENTRY_POINT_GROUP!r} entry-point group"
            )
    return policies
