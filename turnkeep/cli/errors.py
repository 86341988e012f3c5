"""How a command that fails says so: one ``error:`` line on stderr and an exit code, 2 for a
user's mistake, 1 for a bug in turnkeep; with ``--debug``, the traceback first."""

from __future__ import annotations

import sys
import traceback

from rich.console import Console
from rich.markup import escape
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

from turnkeep.client.connection import TemporalUnreachableError
from turnkeep.client.history import TurnHistoryError, describe_failure
from turnkeep.config.files import ConfigError
from turnkeep.devserver.embedded import EmbeddedServerError
from turnkeep.observability.search_attributes import SetupError
from turnkeep.payloads.codec import EncryptionError
from turnkeep.payloads.codec_server import CodecServerError
from turnkeep.payloads.storage import PayloadStorageConfigError, PayloadStorageError

# Errors go to stderr whole on one line (no wrapping), so scripts can read them.
_stderr = Console(stderr=True, highlight=False, soft_wrap=True)

# Mistakes a user makes (a config, an agent, a model, an id) and conditions outside turnkeep
# (a server down, a swept payload): each is told in one line, with exit code 2.
_USER_ERRORS: tuple[type[Exception], ...] = (
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
    SetupError,
    # The server refused a request: an unknown workflow id, a namespace that does not exist.
    RPCError,
    # The turn failed before it could run: an unknown agent, a model it may not use.
    WorkflowFailureError,
)


def report(err: Exception, *, debug: bool) -> int:
    """Print ``err`` as one line on stderr (with ``debug``, after its traceback) and return
    the exit code: 2 for a user's mistake, 1 for anything else (a bug in turnkeep)."""
    if debug:
        traceback.print_exception(err)
    known = isinstance(err, _USER_ERRORS)
    line = _error_text(err) if known else f"{type(err).__name__}: {err}"
    hint = "" if known or debug else " (turnkeep --debug … shows the traceback)"
    _stderr.print(f"[red]error:[/] {escape(line)}{hint}")
    return 2 if known else 1


def _error_text(err: Exception) -> str:
    if isinstance(err, WorkflowFailureError):
        return f"the turn failed: {describe_failure(err.cause)}"
    if isinstance(err, RPCError):
        return f"the Temporal server refused the request: {err.message}"
    return str(err)


def exit_code(done: SystemExit) -> int:
    """The status ``sys.exit(code)`` would give: None is 0, a message is printed and is 1."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)
    return 1
