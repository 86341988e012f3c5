"""Errors activities raise that retrying cannot fix: each says what is wrong in words a user can
act on, and carries a type a workflow (or an operator reading history) can match on."""

from __future__ import annotations

from collections.abc import Iterable

from temporalio.exceptions import ApplicationError


def config_error(kind: str, message: str) -> ApplicationError:
    """A non-retryable error for a turn that asks for something the worker doesn't offer."""
    return ApplicationError(message, type=kind, non_retryable=True)


def known(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"
