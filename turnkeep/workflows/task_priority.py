"""A turn's priority and fairness key as Temporal's task priority: what every activity a
workflow schedules and every child workflow it starts carries, so that busy workers take an
interactive turn's work before queued batch work, and share themselves fairly among tenants.

Temporal's own rule is the model: a workflow's activities and children inherit its priority.
Here the workflow says which (its ``task_priority``: a turn's is its plan's, once
``prepare_turn`` resolved it), and ``current`` reads it where activities are scheduled, so no
call site has to carry it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from temporalio import workflow
from temporalio.common import Priority

from turnkeep.contract.turn_io import TaskPriority

# Temporal's priority keys run from 1 (first) to 5; 3, its default, is "normal".
PRIORITY_KEYS: dict[TaskPriority, int] = {"interactive": 1, "normal": 3, "batch": 5}


def temporal_priority(priority: TaskPriority, fairness_key: str | None) -> Priority:
    """``priority`` and ``fairness_key`` as Temporal's. A normal turn without a fairness key
    gets Temporal's default, exactly what was scheduled before priorities existed, so such
    turns' histories (and replays of them) are unchanged."""
    if priority == "normal" and fairness_key is None:
        return Priority.default
    return Priority(priority_key=PRIORITY_KEYS[priority], fairness_key=fairness_key)


# The priority of what an agent called inline (``inline_agent``) schedules, set around its
# loop: its own plan's (which ``prepare_turn`` lowered by the agent's own), not its caller's.
# A context variable, as the loop's parallel tool calls are asyncio tasks it starts, which
# take the context of their start.
_override: ContextVar[Priority | None] = ContextVar("turnkeep_task_priority", default=None)


@contextlib.contextmanager
def scheduling_at(priority: Priority) -> Iterator[None]:
    """What the running code schedules within this carries ``priority``."""
    token = _override.set(priority)
    try:
        yield
    finally:
        _override.reset(token)


def current() -> Priority:
    """The task priority of what the running workflow schedules: within ``scheduling_at``,
    its priority; else the workflow's own (a ``task_priority`` property: a turn's, a
    session's, an evaluation's), else Temporal's default, which inherits the workflow's (an
    application's workflow running a turn as a step)."""
    override = _override.get()
    if override is not None:
        return override
    # Read as an attribute, not checked against a runtime-checkable Protocol: this runs for
    # every activity a turn schedules, and such an isinstance inspects the class every time.
    priority = getattr(workflow.instance(), "task_priority", None)
    return priority if isinstance(priority, Priority) else Priority.default
