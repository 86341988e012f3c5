"""Human approval of tool calls: which calls wait for a person, what a person decides, and what
the turn records of it. Pure (pydantic and stdlib only), so the workflow, the worker that plans
the turn and any client share these models."""

from __future__ import annotations

from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from turnkeep.workflows.messages import CallToolResult

# The update a person's decision arrives by, and the query listing what waits.
DECIDE_UPDATE = "decide"
PENDING_QUERY = "pending_approvals"
# Who "decides" when nobody did in time.
TIMEOUT_DECIDER = "timeout"
# Bounds on what a client writes into the turn's history with a decision.
_BY_MAX_CHARS = 200
_REASON_MAX_CHARS = 2000


class ApprovalPlan(BaseModel):
    """An agent's approval rules, resolved by ``prepare_turn`` into the turn's plan."""

    tools: list[str]  # fnmatch patterns on `server__tool`
    timeout: float  # seconds a call waits for a decision
    on_timeout: Literal["deny"] = "deny"

    def needs_approval(self, tool: str) -> bool:
        # Case-sensitive, as tool names are: `fs__Write` is not `fs__write`.
        return any(fnmatchcase(tool, pattern) for pattern in self.tools)


class Decision(BaseModel):
    """The argument of the ``decide`` update. ``arguments``, with ``approve``, runs the call
    with these arguments instead of the model's (recorded as an edit)."""

    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1, max_length=_BY_MAX_CHARS)
    decision: Literal["approve", "deny"]
    reason: str | None = Field(default=None, max_length=_REASON_MAX_CHARS)
    by: str = Field(min_length=1, max_length=_BY_MAX_CHARS)
    arguments: dict[str, Any] | None = None


class PendingCall(BaseModel):
    """A tool call waiting for a decision, and since when (workflow time)."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    since: datetime


class DecisionRecord(BaseModel):
    """One decision as the turn keeps it: the audit trail ``turnkeep show`` prints."""

    call_id: str
    tool: str
    decision: Literal["approve", "deny", "timeout"]
    by: str
    reason: str | None = None
    at: datetime
    # Set only when the call was approved with edited arguments: what the model asked for and
    # what ran instead.
    original_arguments: dict[str, Any] | None = None
    arguments: dict[str, Any] | None = None

    @property
    def approved(self) -> bool:
        return self.decision == "approve"

    def denial(self) -> CallToolResult:
        """The isError result a denied (or timed-out) call is answered with, so the model can
        adapt."""
        return CallToolResult.error(
            f"Tool call denied by {self.by}: {self.reason or 'no reason given'}"
        )


def format_seconds(seconds: float) -> str:
    """``1d``, ``2h``, ``90s``: a timeout as a person reads it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
