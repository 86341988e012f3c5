"""The ``turnkeep`` command line: run a turn and stream it, run workers and the dev server,
watch, show and cancel turns. Each group of commands is a module of ``commands/``; this one
merges them into one app and runs it, with ``--debug`` and the one-line error report.

With no server address (no ``--address``, ``TEMPORAL_ADDRESS`` or ``TEMPORAL_PROFILE``), the
commands that talk to Temporal use an embedded dev server with its Web UI, started in the
background on a SQLite file under the state directory so turns and the UI outlive the command
(``turnkeep.cli.connect``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
from typing import Annotated

import typer
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError, CancelledError

from turnkeep.cli.commands import (
    approvals,
    forks,
    gateway,
    payloads,
    replays,
    serve,
    server,
    sessions,
    turns,
    worker,
)
from turnkeep.cli.errors import exit_code, report
from turnkeep.observability.logs import LogFormat, LogLevel, TextFormatter
from turnkeep.observability.logs import configure as configure_logging
from turnkeep.workflows.session_workflow import TURN_FAILED_LOG

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Durable agent turns on Temporal: fast-agent's tool loop as a workflow.",
)


def _reflowed(group: typer.Typer) -> typer.Typer:
    """``group`` with each command's line in a listing (``turnkeep --help``) made from its
    docstring's first paragraph as one line, so the terminal wraps it: typer's listing keeps
    a docstring's own line breaks, which the terminal's width then breaks again."""
    for command in group.registered_commands:
        doc = command.help or inspect.getdoc(command.callback) or ""
        if command.short_help is None and doc:
            command.short_help = " ".join(doc.split("\n\n")[0].split())
    return group


# Without a name, each group's commands become top-level commands, listed in this order.
for group in (turns, replays, sessions, forks, approvals, payloads, worker, server, serve, gateway):
    app.add_typer(_reflowed(group.app))
app.add_typer(_reflowed(sessions.sessions_app), name="sessions")


class _Options:
    debug = False  # `--debug`: a traceback instead of the one-line error


@app.callback()
def _global_options(
    ctx: typer.Context,
    debug: Annotated[
        bool, typer.Option("--debug", help="On an error, print the traceback too.")
    ] = False,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            envvar="TURNKEEP_LOG_FORMAT",
            case_sensitive=False,
            help="Log lines on stderr as text, or as JSON objects that carry the turn's "
            "workflow_id/run_id and the activity's activity_id/attempt.",
        ),
    ] = LogFormat.text,
    log_level: Annotated[
        LogLevel | None,
        typer.Option(
            envvar="TURNKEEP_LOG_LEVEL",
            case_sensitive=False,
            help="Lowest level logged (default: info for `worker` and with --debug, else warning).",
        ),
    ] = None,
) -> None:
    _Options.debug = debug
    _log_to_stderr(debug, log_format, log_level, service=ctx.invoked_subcommand == "worker")


def _log_to_stderr(
    debug: bool, log_format: LogFormat, level: LogLevel | None, *, service: bool
) -> None:
    """Warnings and errors logged by the SDK or an in-process worker (an activity that failed,
    with its traceback) as one line each; with ``--debug``, whole and from level INFO. A
    worker run as a service (``service``) logs from INFO: its start, shutdown and calls.

    A command that runs turns for a person (``run``, ``chat``) speaks in turnkeep's words: the
    SDK core's warnings (a cancelled activity's late completion, say) only with ``--debug``,
    and an activity's failure as what failed and why (``_InTurnkeepsWords``)."""
    if level is None:
        level = LogLevel.info if debug or service else LogLevel.warning
    text = (
        logging.Formatter("%(levelname)s %(name)s: %(message)s")
        if debug
        # A service's lines carry the turn and the call as key=value, for its operator.
        else TextFormatter(with_context=service)
    )
    core = None if debug or service else LogLevel.error
    configure_logging(log_format, level, text_formatter=text, core_level=core, core_details=debug)
    if not (debug or service or log_format is LogFormat.json):
        # For a person: the SDK's lines about activities in turnkeep's words, or none.
        for handler in logging.getLogger().handlers:
            handler.addFilter(_InTurnkeepsWords())


class _InTurnkeepsWords(logging.Filter):
    """For a person at a command that runs turns: the SDK's line for a failed activity
    (``Completing activity as failed``) said as which step failed and why, and nothing for a
    failure the command's own ``error:`` line tells: one that ends the turn (a non-retryable
    error), or a session's turn that failed; nothing either for a cancelled activity."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == workflow.logger.name:
            return record.msg != TURN_FAILED_LOG
        failed = record.exc_info[1] if record.exc_info else None
        if record.name != activity.logger.name or failed is None:
            return True
        if not str(record.msg).startswith("Completing activity as failed"):
            return True
        if isinstance(failed, asyncio.CancelledError | CancelledError):
            # A call cancelled under its turn (Ctrl-C, `turnkeep cancel`, the command's own
            # worker stopping): what the person asked for, not a warning.
            return False
        if isinstance(failed, ApplicationError) and failed.non_retryable:
            return False
        about = getattr(record, "temporal_activity", None) or {}
        if isinstance(failed, ApplicationError) and failed.type:
            why = f"{failed.type}: {failed.message}"
        else:
            why = f"{type(failed).__name__}: {failed}"
        record.msg = "%s failed (attempt %s), to be retried: %s"
        record.args = (about.get("activity_type", "an activity"), about.get("attempt", "?"), why)
        record.exc_info = record.exc_text = None
        return True


def main() -> None:
    code = 0
    try:
        # Not standalone: the parser's own mistakes (a missing argument, an option's bad
        # value, an unknown command) come here, to be told in one `error:` line like every
        # other mistake. `turnkeep` alone prints the help.
        returned = app(sys.argv[1:] or ["--help"], standalone_mode=False)
        code = returned if isinstance(returned, int) else 0  # typer.Exit(code)
    except SystemExit as done:
        code = exit_code(done)
    except typer.Abort:
        code = 1  # end of input where the parser itself was reading some
    except Exception as err:
        code = report(err, debug=_Options.debug)
    # Leave without interpreter finalization, whatever the outcome: the Temporal client's Rust
    # threads can still hold callbacks into Python when a command returns, and finalizing
    # under them aborts the process ("PyGILState_Release … finalizing", SIGABRT) instead of
    # exiting with the command's code. Everything a command opened is closed by now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
