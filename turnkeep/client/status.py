"""How a workflow's run ended, as a reader of its history says it: the words ``show`` uses for
a turn and for each child turn it started, and a failure in its own words."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.converter import DataConverter
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from turnkeep.workflows.actions import failure_text


class TurnStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    TERMINATED = "terminated"
    TIMED_OUT = "timed_out"


def event_time(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


def event_attributes(event: HistoryEvent) -> Any:
    """The attributes ``event`` carries, of whichever type it is: each type names its first
    event (``scheduled_event_id``, ``initiated_event_id``) and carries a ``result`` or a
    ``failure`` only when it has one."""
    name = event.WhichOneof("attributes")
    return getattr(event, name) if name else None


def ms_between(start: datetime | None, end: datetime | None) -> float | None:
    return round((end - start).total_seconds() * 1000, 3) if start and end else None


async def failure_of(converter: DataConverter, failure: Failure) -> str:
    """A failure from a history, decoded (a codec may have encrypted it) and described."""
    copy = Failure()
    copy.CopyFrom(failure)  # decoding works in place; the history stays as fetched
    return describe_failure(await converter.decode_failure(copy))


def describe_failure(error: BaseException) -> str:
    """A decoded failure in its own words: an activity's error without its wrapper, an
    application error with its type."""
    if isinstance(error, ActivityError):
        return failure_text(error)
    if isinstance(error, ApplicationError) and error.type:
        return f"{error.type}: {error.message}"
    return error.message if isinstance(error, FailureError) else str(error)
