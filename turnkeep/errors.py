"""Errors that retrying cannot fix, raised by activities and the configuration they check: each
says what is wrong in words a user can act on, and carries a type a workflow (or an operator
reading history) can match on."""

from __future__ import annotations

from collections.abc import Iterable

from temporalio import activity
from temporalio.exceptions import ApplicationError


def config_error(kind: str, message: str) -> ApplicationError:
    """A non-retryable error for a turn that asks for something the worker doesn't offer."""
    return ApplicationError(message, type=kind, non_retryable=True)


def known(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def require_workflow() -> None:
    """Refuse a standalone execution of the running activity (``temporal activity execute``):
    turnkeep's activities are steps of a turn, and on their own they would let any client run
    the operator's models, tools and hooks with no turn's history to show for it."""
    info = activity.info()
    if not info.in_workflow:
        raise config_error(
            "NotInWorkflow",
            f"Activity {info.activity_type!r} runs only as a step of a turn workflow, not on "
            "its own; start a TurnWorkflow instead.",
        )
