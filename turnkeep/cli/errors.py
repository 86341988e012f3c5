"""How a command that fails says so: one ``error:`` line on stderr and an exit code, 2 for a
user's mistake, 1 for a bug in turnkeep; with ``--debug``, the traceback first.

Whatever Temporal refused (a start, an update, a query) is told with its cause, the words of
whoever refused it: the server, or the workflow's validator (``no call 'call_9_9' is waiting
for approval``), never only the SDK's name for the failure."""

from __future__ import annotations

import sys
import traceback

import typer
from rich.console import Console
from rich.markup import escape
from temporalio.client import (
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import FailureError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.connection import TemporalUnreachableError
from turnkeep.client.history import TurnHistoryError
from turnkeep.client.replays import ReplayError
from turnkeep.client.sessions import SessionClosedError
from turnkeep.client.status import describe_failure
from turnkeep.client.turns import NoBudgetWait
from turnkeep.config.files import ConfigError
from turnkeep.config.problems import validator_message
from turnkeep.devserver.embedded import EmbeddedServerError
from turnkeep.observability.search_attributes import SetupError
from turnkeep.payloads.codec import EncryptionError
from turnkeep.payloads.codec_server import CodecServerError
from turnkeep.payloads.storage.errors import PayloadStorageConfigError, PayloadStorageError

# Errors go to stderr whole on one line (no wrapping), so scripts can read them.
_stderr = Console(stderr=True, highlight=False, soft_wrap=True)

# Mistakes a user makes (a config, an agent, a model, an id, an option) and conditions outside
# turnkeep (a server down, a swept payload): each is told in one line, with exit code 2.
_USER_ERRORS: tuple[type[Exception], ...] = (
    # The command line itself: a missing argument, an option's bad value, an unknown command.
    typer.TyperException,
    ConfigError,
    EmbeddedServerError,
    PayloadStorageConfigError,
    # A turn's stored payload is missing (swept, or another directory).
    PayloadStorageError,
    # A payload this config has no key for, or one that fails authentication.
    EncryptionError,
    CodecServerError,
    TemporalUnreachableError,
    TurnHistoryError,
    # `turnkeep replay` of an unknown turn, or one that has not completed.
    ReplayError,
    SetupError,
    SessionClosedError,
    # `turnkeep budget` on a turn that is not waiting at its budget.
    NoBudgetWait,
    # The server refused a request: an unknown workflow id, a namespace that does not exist.
    RPCError,
    # A workflow id in use (`run --id`).
    WorkflowAlreadyStartedError,
    # The workflow refused an update or a query: an unknown call, a session closing...
    WorkflowUpdateFailedError,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    # No worker took the update in time.
    WorkflowUpdateRPCTimeoutOrCancelledError,
    # The turn failed before it could run: an unknown agent, a model it may not use.
    WorkflowFailureError,
)


def report(err: Exception, *, debug: bool) -> int:
    """Print ``err`` as one line on stderr (with ``debug``, after its traceback) and return
    the exit code: 2 for a user's mistake, 1 for anything else (a bug in turnkeep)."""
    if debug:
        traceback.print_exception(err)
    known = isinstance(err, _USER_ERRORS)
    if isinstance(err, ConfigError):
        # A config wrong in several places: one line for each, so all are fixed in one go.
        for problem in err.problems:
            print_error(problem)
        return 2
    line = error_text(err) if known else f"{type(err).__name__}: {err}"
    hint = "" if known or debug else " (turnkeep --debug … shows the traceback)"
    print_error(line + hint)
    return 2 if known else 1


def print_error(line: str) -> None:
    """``error: line`` on stderr, as every command says what went wrong: lowercase after
    ``error:``, whoever wrote the words (click's ``Missing argument``, a server's ``Cannot``)."""
    _stderr.print(f"[red]error:[/] {escape(_lowercase_start(line))}")


def _lowercase_start(line: str) -> str:
    # Only a capitalised word: a name (`ModelNotAllowed`, `MCP`) keeps its case.
    first = line.split(" ", 1)[0].rstrip(":,.")
    if first[:1].isupper() and first[1:].islower():
        return line[:1].lower() + line[1:]
    return line


def error_text(err: Exception) -> str:
    """What went wrong, in one line: the cause, not the exception's class."""
    if isinstance(err, typer.TyperException):
        return _usage_text(err)
    if isinstance(err, WorkflowFailureError):
        return f"the turn failed: {describe_failure(err.cause)}"
    if isinstance(err, WorkflowUpdateFailedError):
        cause = err.cause
        # The validator's (or the handler's) own words: why the workflow refused.
        return cause.message if isinstance(cause, FailureError) else str(cause)
    if isinstance(err, WorkflowQueryFailedError):
        return f"the workflow could not answer: {err.message}"
    if isinstance(err, WorkflowQueryRejectedError):
        status = err.status.name.lower() if err.status else "closed"
        return f"the workflow is {status}: it answers no queries"
    if isinstance(err, WorkflowUpdateRPCTimeoutOrCancelledError):
        return (
            "no worker took the request in time: is a worker running for the workflow's task queue?"
        )
    if isinstance(err, WorkflowAlreadyStartedError):
        return f"a workflow with id {err.workflow_id!r} is already running (choose another --id)"
    if isinstance(err, RPCError):
        return _refusal_text(err)
    return str(err)


def _refusal_text(err: RPCError) -> str:
    # The server's words for the two refusals a person meets most (a decision sent to a turn
    # that has ended, an id mistyped) name the server's internals; say what they mean instead.
    if err.status == RPCStatusCode.NOT_FOUND:
        if "already completed" in err.message:
            return (
                "that turn or session has already ended, so nothing waits there any more "
                "(`turnkeep show ID` says how it ended)"
            )
        if err.message.startswith("workflow not found"):
            return "no turn or session has that id (`run` and `sessions` print the ids)"
    return f"the Temporal server refused the request: {err.message}"


def _usage_text(err: typer.TyperException) -> str:
    """The parser's message (a missing argument, an option's bad value, an unknown command),
    with where to read the command's usage when the parser knows the command."""
    context = getattr(err, "ctx", None)  # a usage error's
    path = getattr(context, "command_path", None)
    where = f" (see `{path} --help`)" if path else ""
    # An option's type checked by pydantic says so before the cause: only the cause is told.
    return " ".join(validator_message(err.format_message()).split()) + where


def exit_code(done: SystemExit) -> int:
    """The status ``sys.exit(code)`` would give: None is 0, a message is printed and is 1."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)
    return 1
