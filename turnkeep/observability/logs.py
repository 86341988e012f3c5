"""The CLI's log lines: plain text for people, or JSON lines for a log pipeline
(``--log-format json``), where every line about a turn says which turn and which call.

The Temporal SDK's loggers know that: ``temporalio.workflow.logger`` puts the workflow's
identity in each record's ``temporal_workflow`` attribute, ``temporalio.activity.logger`` the
activity's in ``temporal_activity``. ``JsonFormatter`` flattens them into top-level keys
(``workflow_id``, ``run_id``, ``activity_id``, ``attempt``...). Lines that other code logs while
an activity runs (the MCP pool, the provider SDKs' HTTP clients) get the same keys from
``ActivityContext``, which reads the running activity from its context variable.

Only an allow-list of attributes reaches a line: a library's ``extra`` may hold a request or
its headers, and a log line must never carry a credential.

The SDK's Rust core (polling, completions, the connection) logs on its own, by default as
coloured lines written straight to stderr, whatever the process's format. ``configure`` sends
them through Python's logging instead, as records of the ``temporalio.core`` logger: they take
the process's format, level and handler like every other line (``core_log_forwarding``).
"""

from __future__ import annotations

import enum
import json
import logging
import time
from typing import Any

from temporalio import activity, workflow
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)


class LogFormat(enum.StrEnum):
    text = "text"
    json = "json"


class LogLevel(enum.StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


# Record attribute -> (key in the SDK's dict -> key on the line).
_TEMPORAL_KEYS: dict[str, dict[str, str]] = {
    # The workflow's own `attempt` (a retried workflow run, nearly always 1) is left out: on a
    # line `attempt` means an activity's attempt.
    "temporal_workflow": {
        "workflow_id": "workflow_id",
        "run_id": "run_id",
        "workflow_type": "workflow_type",
        "task_queue": "task_queue",
        "namespace": "namespace",
    },
    "temporal_activity": {
        "workflow_id": "workflow_id",
        "workflow_run_id": "run_id",
        "workflow_type": "workflow_type",
        "activity_id": "activity_id",
        "activity_type": "activity_type",
        "attempt": "attempt",
        "task_queue": "task_queue",
        "namespace": "namespace",
    },
}
_HTTP_CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore")
# The logger the SDK's core logs through (``core_log_forwarding``).
CORE_LOGGER = "temporalio.core"
# turnkeep's own `extra` keys (activity.logger.info(..., extra={"call_id": ...})).
_TURNKEEP_KEYS = ("call_id", "tool", "model")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``timestamp`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the turn's and call's identity when the record has it, and ``exception``
    (the traceback, newlines escaped) when one was logged."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **context(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def context(record: logging.LogRecord) -> dict[str, Any]:
    """The turn's and the call's identity a record carries (the allow-listed keys only)."""
    found: dict[str, Any] = {}
    for attribute, keys in _TEMPORAL_KEYS.items():
        details = getattr(record, attribute, None)
        if isinstance(details, dict):
            for key, name in keys.items():
                if details.get(key) is not None:
                    found.setdefault(name, details[key])
    for key in _TURNKEEP_KEYS:
        value = getattr(record, key, None)
        if isinstance(value, str | int | float):
            found[key] = value
    return found


class TextFormatter(logging.Formatter):
    """One line per record, for a person or an operator reading text: ``level: message``,
    then (``with_context``) the record's context as ``key=value`` pairs and the logged
    exception as ``error="Type: message"``, instead of a Python dict appended to the message
    and a traceback over many lines."""

    def __init__(self, *, with_context: bool) -> None:
        super().__init__()
        self.with_context = with_context

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname.lower()}: {record.getMessage().partition(chr(10))[0]}"
        if not self.with_context:
            return line
        pairs = dict(context(record))
        failed = record.exc_info[1] if record.exc_info else None
        if failed is not None:
            pairs["error"] = f"{type(failed).__name__}: {failed}".partition("\n")[0]
        return " ".join([line, *(f"{key}={_value(value)}" for key, value in pairs.items())])


def _value(value: Any) -> str:
    # Quoted (as JSON) when it would not read as one token: a space, a quote, an `=`.
    text = str(value)
    if not text or any(c.isspace() or c in "\"'=" for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


def _timestamp(created: float) -> str:
    # time, not datetime: a workflow's log call formats inside the workflow's thread, where
    # reading the clock through datetime is what the sandbox forbids.
    whole = int(created)
    millis = int((created - whole) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


class ActivityContext(logging.Filter):
    """Gives a record logged while an activity runs, by any logger, the activity's identity
    (``temporal_activity``), as ``temporalio.activity.logger`` gives its own records. A handler
    filter runs in the logging call's context, where the activity's context variable is set."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "temporal_activity") and activity.in_activity():
            info = activity.info()
            record.temporal_activity = {
                "activity_id": info.activity_id,
                "activity_type": info.activity_type,
                "attempt": info.attempt,
                "namespace": info.namespace,
                "task_queue": info.task_queue,
                "workflow_id": info.workflow_id,
                "workflow_run_id": info.workflow_run_id,
                "workflow_type": info.workflow_type,
            }
        return True


class _CoreLog:
    # Whether a forwarded line carries Core's structured fields (task tokens, gRPC statuses):
    # for debugging only (``configure``'s ``core_details``).
    details = False


def core_log_forwarding() -> LoggingConfig:
    """The logging of a ``Runtime`` whose core logs through Python's ``temporalio.core``
    logger, from warnings up (the SDK's own default level), instead of printing its own
    lines."""
    forwarding = LogForwardingConfig(
        logger=logging.getLogger(CORE_LOGGER),
        append_target_to_name=False,
        append_log_fields_to_message=_CoreLog.details,
    )
    return LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"), forwarding=forwarding
    )


def configure(
    log_format: LogFormat,
    level: LogLevel,
    *,
    text_formatter: logging.Formatter,
    core_level: LogLevel | None = None,
    core_details: bool = False,
) -> None:
    """Log to stderr from ``level`` up, as ``log_format``; the SDK's warnings too, and its
    core's lines from ``core_level`` (default: ``level``) up, with their structured fields
    when ``core_details``. Before any Temporal client is made: the core's forwarding is a
    setting of the default ``Runtime`` those clients use."""
    _CoreLog.details = core_details
    logging.getLogger(CORE_LOGGER).setLevel((core_level or level).upper())
    Runtime.set_default(
        Runtime(telemetry=TelemetryConfig(logging=core_log_forwarding())),
        error_if_already_set=False,
    )
    handler = logging.StreamHandler()
    if log_format is LogFormat.json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(text_formatter)
    if log_format is LogFormat.json or isinstance(text_formatter, TextFormatter):
        # The identity is in the line's keys: the SDK would also append it to each message
        # as a Python dict.
        workflow.logger.workflow_info_on_message = False
        activity.logger.activity_info_on_message = False
    handler.addFilter(ActivityContext())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if level is not LogLevel.debug:
        # The HTTP clients log every request at INFO: a second line per model call, and a
        # URL that may hold credentials in its query. Only when debugging.
        for name in _HTTP_CLIENT_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # the SDK's warnings too (a workflow's unfinished handlers)
