"""Where a workflow's time goes, read from its history's event timestamps (server clock).

Every step of a turn, and of a floor, is a workflow task (the worker runs workflow code and
answers with commands) followed by an activity (the worker runs it and reports its result):

- ``workflow task queued``: scheduled → started, the server finding the worker;
- ``workflow task``: started → completed, the worker running workflow code (sandbox, payload
  conversion, the loop's bookkeeping) and the server recording the commands;
- ``<activity> run``: started → completed, the activity's own time plus reporting its result
  (a just-scheduled activity is handed straight back to the worker, so it is never queued).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

WFT_QUEUED = "workflow task queued"
WFT_RUN = "workflow task"


def _ms(event: HistoryEvent) -> float:
    return float(event.event_time.ToNanoseconds()) / 1e6


def phases(events: Iterable[HistoryEvent]) -> dict[str, list[float]]:
    """Milliseconds of each phase, per occurrence."""
    out: dict[str, list[float]] = defaultdict(list)
    activity_type: dict[int, str] = {}  # scheduled event id -> activity type
    started_at: dict[int, tuple[str, float]] = {}  # started event id -> (type, time)
    wft_scheduled = wft_started = 0.0
    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            wft_scheduled = _ms(event)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            wft_started = _ms(event)
            out[WFT_QUEUED].append(wft_started - wft_scheduled)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            out[WFT_RUN].append(_ms(event) - wft_started)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            activity_type[event.event_id] = name
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            scheduled = event.activity_task_started_event_attributes.scheduled_event_id
            started_at[event.event_id] = (activity_type[scheduled], _ms(event))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            started = event.activity_task_completed_event_attributes.started_event_id
            name, at = started_at[started]
            out[f"{name} run"].append(_ms(event) - at)
    return out


def medians(runs: Iterable[Iterable[HistoryEvent]]) -> dict[str, float]:
    """Median milliseconds of each phase over all occurrences in ``runs`` (several workflows'
    histories, so one slow step does not decide)."""
    merged: dict[str, list[float]] = defaultdict(list)
    for events in runs:
        for name, values in phases(events).items():
            merged[name] += values
    return {name: statistics.median(values) for name, values in merged.items()}
