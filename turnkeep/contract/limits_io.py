"""What crosses the boundary between a turn, the activities that reach a limiter and the
limiter workflow of one configured limit (``limits:``): the values of a limit, a request for
capacity, the limiter's answer, its grant and what the turn settles after the call."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from turnkeep.contract.compact import Compact
from turnkeep.contract.turn_io import NAME_MAX_CHARS, TaskPriority

# The workflow type of a limiter, and its id: one per configured limit per namespace.
LIMITER_WORKFLOW_NAME = "LimiterWorkflow"
LIMITER_ID_PREFIX = "turnkeep-limit-"

# The limiter's handlers, and the turn's.
ASK_CAPACITY_SIGNAL = "ask_capacity"
SETTLE_CAPACITY_SIGNAL = "settle_capacity"
WITHDRAW_CAPACITY_SIGNAL = "withdraw_capacity"
CAPACITY_GRANT_SIGNAL = "capacity_granted"

# Activities: the turn's way to the limiter, and the limiter's read of its values.
ASK_CAPACITY = "ask_capacity"
LIMIT_VALUES = "limit_values"

# The failures of a provider's rate limit (429) and overload (529): for a limited model they
# go back to the turn, which tells the limiter, instead of being retried within the activity.
RATE_LIMITED = ("ProviderRateLimited", "ProviderOverloaded")

# Bounds on what a request may claim, so that no request (a forged one included) can hold a
# limit for long or poison its token estimate.
MAX_LEASE_SECONDS = 4 * 3600.0
MAX_TOKENS_CLAIMED = 10_000_000
_ID = r"^[A-Za-z0-9._:/@+-]{1,300}$"


def limiter_id(limit: str) -> str:
    """The workflow id of ``limit``'s limiter."""
    return f"{LIMITER_ID_PREFIX}{limit}"


def waiting_text(limit: str, why: str) -> str:
    """What a waiting turn shows: ``waiting for capacity: gpt-4.1 58/60 rpm``."""
    return f"waiting for capacity: {limit} {why}".rstrip()


class LimitValues(Compact):
    """One entry of ``limits:`` as the limiter enforces it (None: that dimension is free)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrency: int | None = None


class CapacityRequest(Compact):
    """A turn asks ``limit`` for one model call's capacity."""

    limit: str = Field(min_length=1, max_length=NAME_MAX_CHARS)
    # Unique within the turn's run: the call and its attempt.
    request_id: str = Field(pattern=_ID)
    # The turn the grant goes to (the activity checks it is the turn that asks).
    workflow_id: str = Field(min_length=1, max_length=1000)
    run_id: str = Field(min_length=1, max_length=100)
    priority: TaskPriority = "normal"
    fairness_key: str | None = Field(default=None, max_length=NAME_MAX_CHARS)
    # The request's size, and the most it may answer with (None: the limit's learned
    # average output is the estimate).
    input_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS_CLAIMED)
    max_output_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS_CLAIMED)
    # How long the grant holds concurrency if the turn never settles it (the call's timeout).
    lease_seconds: float = Field(default=600.0, gt=0, le=MAX_LEASE_SECONDS)

    @property
    def key(self) -> str:
        """The request's key in the limiter: unique across every turn of the namespace."""
        return f"{self.workflow_id}/{self.run_id}/{self.request_id}"


class CapacityGrant(Compact):
    """The limiter's answer to a request, by signal to the turn (which checks it matches an
    outstanding request of its own): the grant, or, with ``waiting``, why it is not granted
    yet, as the turn shows it ("58/60 rpm", "backing off until 12:00:03 UTC")."""

    limit: str = Field(max_length=NAME_MAX_CHARS)
    request_id: str = Field(pattern=_ID)
    waiting: str | None = Field(default=None, max_length=500)


class CapacitySettle(Compact):
    """What a granted call used, or that it never ran (``used`` None), and the provider's
    ``retry-after`` when it answered 429/529: every worker's calls of the limit wait that long."""

    request_id: str = Field(pattern=_ID)
    workflow_id: str = Field(min_length=1, max_length=1000)
    run_id: str = Field(min_length=1, max_length=100)
    used: int | None = Field(default=None, ge=0, le=MAX_TOKENS_CLAIMED)
    retry_after: float | None = Field(default=None, ge=0, le=3600.0)
    # Withdrawn: the turn no longer wants it (cancelled while waiting), granted or not.
    outcome: Literal["settled", "withdrawn"] = "settled"

    @property
    def key(self) -> str:
        return f"{self.workflow_id}/{self.run_id}/{self.request_id}"


class CapacityWait(Compact):
    """A turn waiting for a limit's capacity, as the limiter's ``waiting`` query lists it."""

    limit: str
    workflow_id: str
    priority: TaskPriority = "normal"
    why: str  # "58/60 rpm · 3 ahead"


class LimiterStart(Compact):
    """A limiter run's input: empty for the first run; the ledger a run continued as new
    carries (taken only from a run of the same workflow, never from a client's start)."""

    ledger: dict[str, object] | None = None
