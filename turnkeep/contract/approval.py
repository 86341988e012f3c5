"""Approval of tool calls: which calls wait for a person, which an approval policy decides, what
a person or a policy decides, and what the turn records of it; the result a client submits for
a client-side tool's call; the rules that remember a decision ("always allow"). Pure (pydantic
and stdlib only, and ``jsonschema`` imported when a submitted result is checked), so the
workflow, the worker that plans the turn and any client share these models.

An approval policy is a function registered on the worker by name
(``turnkeep.activities.approval_policy`` runs it, as an activity: user code is not
deterministic). It sees each call in its scope as an ``ApprovalRequest`` and answers
``"allow"`` (the call runs), ``"deny"`` (it is answered with an isError result, like a person's
denial) or ``"ask"`` (it waits for a person, as the glob rules make it), or a
``PolicyDecision`` with a reason."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from turnkeep.contract.compact import Compact
from turnkeep.contract.messages import CallToolResult, ContentBlock, TextContent

# The update a person's decision arrives by, and the query listing what waits.
DECIDE_UPDATE = "decide"
PENDING_QUERY = "pending_approvals"
# The update that revokes an "always allow" rule (on a turn and on a session), the query that
# lists a workflow's rules, and the signal a session tells its running turn by that one of the
# session's rules was revoked.
REVOKE_ALLOW_UPDATE = "revoke_allow"
ALLOW_RULES_QUERY = "allow_rules"
SESSION_RULE_REVOKED_SIGNAL = "session_rule_revoked"
# The signal an agent's child turn tells its parent turn by which of its calls (and of its own
# children's) wait for a decision.
CHILD_APPROVALS_SIGNAL = "child_approvals"
# The error type a turn refuses a decision with when the call waits in one of its child turns:
# its only detail is that turn's workflow id, where the client sends the decision instead.
DECIDED_IN_CHILD = "DecidedInChildTurn"
# Who "decides" when nobody did in time.
TIMEOUT_DECIDER = "timeout"
# The activity that puts a batch's calls to the agent's approval policy.
APPROVAL_POLICY = "approval_policy"
# The reason a call is denied with when its policy could not decide (it raised, on every
# attempt, or answered something that is not a decision): never allowed on a failure.
POLICY_FAILED_REASON = "approval policy failed"
# What a denied call's result says when whoever denied it gave no reason.
NO_REASON = "no reason given"
# Bounds on what a client writes into the turn's history with a decision.
_BY_MAX_CHARS = 200
_REASON_MAX_CHARS = 2000

# What a waiting call waits for: a person's approval of a tool call, an MCP server's
# elicitation or sampling request made during one, a client-side tool's result, or a
# raise of a spent budget.
WaitKind = Literal["approval", "elicitation", "sampling", "client_result", "budget"]
# How long a decision is remembered ("always allow"): for the rest of the turn, or of the
# session the turn belongs to.
RememberScope = Literal["turn", "session"]
# What settled a wait: a decision either way, or nobody in time.
Decided = Literal["approve", "deny", "timeout"]


class ApprovalPlan(Compact):
    """An agent's approval rules, resolved by ``prepare_turn`` into the turn's plan."""

    tools: list[str] = Field(default_factory=list)  # fnmatch patterns on `server__tool`
    timeout: float  # seconds a call waits for a decision
    on_timeout: Literal["deny"] = "deny"
    # The registered approval policy that decides first; None: every call `tools` names waits
    # for a person.
    policy: str | None = None

    def needs_approval(self, tool: str) -> bool:
        """Whether a call of ``tool`` is held: for a person or, with a policy, for the policy
        (which asks a person only when it answers "ask"). A policy with no ``tools`` sees
        every call."""
        if self.policy is not None and not self.tools:
            return True
        # Case-sensitive, as tool names are: `fs__Write` is not `fs__write`.
        return any(fnmatchcase(tool, pattern) for pattern in self.tools)


class SubmittedResult(BaseModel):
    """The result a client submits for a call of a client-side tool: MCP's ``CallToolResult``
    (``content`` blocks, ``structured_content``, ``is_error``)."""

    model_config = ConfigDict(extra="forbid")

    content: list[ContentBlock] = Field(default_factory=list)
    structured_content: dict[str, Any] | None = None
    is_error: bool = False

    @classmethod
    def of(
        cls, result: str | list[Any] | dict[str, Any], *, is_error: bool = False
    ) -> SubmittedResult:
        """A result from text, a list of content blocks, or a dict (structured content, also
        given as its JSON text, as MCP servers give it for clients without structured
        content)."""
        if isinstance(result, str):
            return cls(content=[TextContent(text=result)], is_error=is_error)
        if isinstance(result, list):
            return cls.model_validate({"content": result, "is_error": is_error})
        text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
        return cls(content=[TextContent(text=text)], structured_content=result, is_error=is_error)

    def as_result(self) -> CallToolResult:
        return CallToolResult(
            content=self.content, structured_content=self.structured_content, is_error=self.is_error
        )


class Decision(BaseModel):
    """The argument of the ``decide`` update. ``arguments``, with ``approve``, runs the call
    with these arguments instead of the model's (recorded as an edit). ``result`` answers a
    client-side tool's call (with ``approve``; ``deny`` answers it with a denial). ``remember``,
    with ``approve``, also allows later calls of the same tool (with ``remember_arguments``:
    only with the same arguments) for the rest of the turn or of its session."""

    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1, max_length=_BY_MAX_CHARS)
    decision: Literal["approve", "deny"]
    reason: str | None = Field(default=None, max_length=_REASON_MAX_CHARS)
    by: str = Field(min_length=1, max_length=_BY_MAX_CHARS)
    arguments: dict[str, Any] | None = None
    # A budget wait: the raised budget, in the budget's unit (with approve).
    limit: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # An elicitation's answer: with approve, MCP's accept, the content checked against the
    # request's schema; deny is MCP's decline, or with ``cancel`` its cancel.
    content: dict[str, Any] | None = None
    cancel: bool = False
    # A client-side tool's result (with approve).
    result: SubmittedResult | None = None
    # Always allow: remember an approval for the rest of the turn or session, for this tool
    # (with these same arguments only, with `remember_arguments`).
    remember: RememberScope | None = None
    remember_arguments: bool = False


class PendingCall(BaseModel):
    """A tool call waiting for a decision, and since when (workflow time). ``turn_id`` and
    ``agent`` say whose call it is when it waits in a child turn (an agent the turn called as a
    tool, or an agent that one called...); None for the turn's own calls."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    since: datetime
    turn_id: str | None = None
    agent: str | None = None
    kind: WaitKind = "approval"
    # What a person is asked, in one line (an elicitation's message, a budget's spending), and
    # the JSON schema an answer must match (an elicitation's requestedSchema, a client-side
    # tool's output schema).
    prompt: str | None = None
    requested_schema: dict[str, Any] | None = None


class ChildApprovals(BaseModel):
    """The argument of the ``child_approvals`` signal: every call now waiting in the child turn
    ``turn_id`` and in its own child turns (each with its ``turn_id`` set); empty once none
    waits."""

    model_config = ConfigDict(extra="forbid")

    turn_id: str = Field(min_length=1)
    calls: list[PendingCall]


class DecisionRecord(BaseModel):
    """One decision as the turn keeps it: the audit trail ``turnkeep show`` prints."""

    call_id: str
    tool: str
    decision: Decided
    by: str
    reason: str | None = None
    at: datetime
    # Set only when the call was approved with edited arguments: what the model asked for and
    # what ran instead.
    original_arguments: dict[str, Any] | None = None
    arguments: dict[str, Any] | None = None
    kind: WaitKind = "approval"
    # The "always allow" rule this decision set (its scope in `remember`), or, for a call a
    # rule allowed without waiting, that rule's id (`by` is then `rule:<who set it>`).
    rule: str | None = None
    remember: RememberScope | None = None

    @property
    def approved(self) -> bool:
        return self.decision == "approve"

    def denial(self) -> CallToolResult:
        """The isError result a denied (or timed-out) call is answered with, so the model can
        adapt."""
        return CallToolResult.error(f"Tool call denied by {self.by}: {self.reason or NO_REASON}")


# -- always allow --------------------------------------------------------------------------------


class AllowRule(BaseModel):
    """A remembered approval: calls of ``tool`` (with ``arguments``: only with exactly these)
    run without waiting for the rest of the turn (``scope`` "turn") or of the session. Set by a
    person's decision (``call_id``, ``by``, ``at``); kept once revoked, for the audit."""

    id: str = Field(min_length=1, max_length=_BY_MAX_CHARS)
    tool: str
    arguments: dict[str, Any] | None = None
    scope: RememberScope
    by: str
    at: datetime
    call_id: str
    revoked_by: str | None = None
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def covers(self, tool: str, arguments: dict[str, Any]) -> bool:
        return (
            self.active
            and self.tool == tool
            and (self.arguments is None or self.arguments == arguments)
        )


def rule_decider(rule: AllowRule) -> str:
    """Who a call a rule allowed is recorded as approved by."""
    return f"rule:{rule.by}"


def allowed_by(rule: AllowRule, call_id: str, tool: str, now: datetime) -> DecisionRecord:
    """The record of a call ``rule`` let run without waiting."""
    return DecisionRecord(
        call_id=call_id, tool=tool, decision="approve", by=rule_decider(rule), at=now, rule=rule.id
    )


class RevokeAllow(BaseModel):
    """The argument of the ``revoke_allow`` update: the rule to revoke, and who revokes it."""

    model_config = ConfigDict(extra="forbid")

    rule_id: str = Field(min_length=1, max_length=_BY_MAX_CHARS)
    by: str = Field(min_length=1, max_length=_BY_MAX_CHARS)


def revoke_problem(rules: list[AllowRule], rule_id: str, where: str) -> str | None:
    """Why rule ``rule_id`` cannot be revoked from ``rules`` (those of ``where``: "this turn",
    "this session"), or None."""
    rule = next((r for r in rules if r.id == rule_id), None)
    if rule is None:
        active = ", ".join(r.id for r in rules if r.active) or "none"
        return f"no rule {rule_id!r} in {where} (active rules: {active})"
    if not rule.active:
        return f"rule {rule_id!r} was already revoked, by {rule.revoked_by}"
    return None


def revoked(rule: AllowRule, by: str, at: datetime) -> AllowRule:
    return rule.model_copy(update={"revoked_by": by, "revoked_at": at})


# -- client results ------------------------------------------------------------------------------


def result_problem(result: SubmittedResult, schema: dict[str, Any] | None) -> str | None:
    """Why ``result`` does not answer a call whose tool has output schema ``schema``, or None:
    with a schema, structured content that matches it is required (MCP asks the same of a
    server's result), unless the result is an error."""
    if schema is None or result.is_error:
        return None
    if result.structured_content is None:
        return "the tool has an output schema: the result needs structured content (a JSON object)"
    # Imported here: only a turn with a client-side tool that has an output schema needs it.
    import jsonschema

    try:
        jsonschema.validate(result.structured_content, schema)
    except jsonschema.ValidationError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "the result"
        return f"the result does not match the tool's output schema at {where}: {err.message}"
    except jsonschema.SchemaError as err:
        return f"the tool's output schema is not a valid JSON schema: {err.message}"
    return None


# -- approval policies ---------------------------------------------------------------------------


class ApprovalRequest(BaseModel):
    """One tool call, as an approval policy sees it. ``workflow_id`` is the turn's, as Temporal
    gave it to the activity, not as a client claimed it."""

    agent: str
    workflow_id: str
    call_id: str
    name: str  # server__tool, as the model and the approval globs name it
    server: str
    tool: str  # the tool's own name
    arguments: dict[str, Any]


PolicyAction = Literal["allow", "deny", "ask"]


class PolicyDecision(BaseModel):
    """A policy's answer with a reason: a denial's reason reaches the model and the audit
    trail."""

    model_config = ConfigDict(extra="forbid")

    action: PolicyAction
    reason: str | None = Field(default=None, max_length=_REASON_MAX_CHARS)


PolicyAnswer = PolicyAction | PolicyDecision
ApprovalPolicy = Callable[[ApprovalRequest], PolicyAnswer | Awaitable[PolicyAnswer]]
"""An approval policy: sync (run in a thread) or async, answering "allow", "deny" or "ask", or
a ``PolicyDecision``."""


class PolicyCall(BaseModel):
    """A call put to the policy: what the model asked for."""

    call_id: str
    name: str  # server__tool
    arguments: dict[str, Any]


class PolicyRequest(BaseModel):
    """The input of the ``approval_policy`` activity: the calls of one tool-use batch in the
    policy's scope, so a batch adds one activity to the history, not one per call."""

    agent: str
    policy: str
    calls: list[PolicyCall] = Field(min_length=1)


class PolicyVerdicts(BaseModel):
    """The policy's decision on each call of a ``PolicyRequest``, by call id."""

    decisions: dict[str, PolicyDecision]


def policy_decider(policy: str) -> str:
    """Who a policy's decisions are recorded as taken by."""
    return f"policy:{policy}"


def failed_policy(request: PolicyRequest) -> PolicyVerdicts:
    """What a policy that could not decide decides: deny every call it was asked about."""
    deny = PolicyDecision(action="deny", reason=POLICY_FAILED_REASON)
    return PolicyVerdicts(decisions={call.call_id: deny for call in request.calls})


def format_seconds(seconds: float) -> str:
    """``1d``, ``2h``, ``90s``: a timeout as a person reads it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
