"""How turnkeep's workflows take their start arguments: as they come from any client.

A workflow started by a client gets one input; a run that continued as new also gets the state
its predecessor carried over. A client may send anything, so the arguments are taken untyped
(the SDK would fail a start of the wrong arity or shape on every attempt of its first workflow
task) and checked here, and only a run that really continued as new may carry state: a state
from a client would skip what the workflow checks at its start."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

Input = TypeVar("Input", bound=BaseModel)
Carried = TypeVar("Carried", bound=BaseModel)


def start_arguments(
    args: Sequence[Any],
    input_type: type[Input],
    carried_type: type[Carried],
    *,
    usage: str,
    error_type: str,
) -> tuple[Input, Carried | None]:
    """The input and the carried state (None unless continued) from a start's arguments, or a
    non-retryable ``ApplicationError`` of ``error_type`` that starts with ``usage`` and says
    what is wrong: retrying a start with the same arguments cannot help."""
    if not 1 <= len(args) <= 2:
        raise _bad_start(f"{usage}; got {len(args)}", error_type)
    value = _validated(input_type, args[0], error_type)
    if len(args) == 1 or args[1] is None:
        return value, None
    if not continued_as_new():
        raise _bad_start(
            f"{usage}; got 2: only a run continued from an earlier one (continue-as-new) may "
            "carry its state",
            error_type,
        )
    return value, _validated(carried_type, args[1], error_type)


def handler_argument(
    args: Sequence[Any], model: type[Input], handler: str, error_type: str
) -> Input:
    """The one argument an update or signal ``handler`` takes, as ``model``, or a
    non-retryable ``ApplicationError`` of ``error_type`` saying what is wrong (a validator
    raises it to refuse the call)."""
    name = model.__name__
    if len(args) != 1:
        raise _bad_start(f"{handler} takes one argument, a {name}; got {len(args)}", error_type)
    try:
        return model.model_validate(args[0])
    except ValidationError as err:
        raise _bad_start(f"not a {name}: {err}", error_type) from None


def continued_as_new() -> bool:
    """Whether this run was started by its predecessor continuing as new, which only the
    workflow itself can do. Retries and cron runs also name the run before them, but start
    with the arguments a client gave the first one."""
    info = workflow.info()
    return info.continued_run_id is not None and info.attempt == 1 and not info.cron_schedule


def _validated(model: type[Input], value: Any, error_type: str) -> Input:
    try:
        return model.model_validate(value)
    except ValidationError as err:
        # pydantic's text names each bad field and shortens the values it quotes.
        raise _bad_start(str(err), error_type) from None


def _bad_start(message: str, error_type: str) -> ApplicationError:
    return ApplicationError(message, type=error_type, non_retryable=True)
