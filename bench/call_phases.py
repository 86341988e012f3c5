"""Where a call's time goes (issue #46): the phases of one function-tool call and of one agent
call (a child turn), read from the event times the server recorded in the parent's and the
child's histories, so that a change to either is measured where it acts.

A call runs from the parent's workflow task that asked for it (the one handling the model's
answer) to the parent's next workflow task (the one handling the call's result), both ended
(``WORKFLOW_TASK_COMPLETED``). A function-tool call is one activity and that next task; an
agent call is the child's start (the server creates the child, records it started in the
parent, and only then schedules the child's first task), the child's first workflow task (its
local ``prepare_turn``, scheduling its model call), the child's model call, its last workflow
task (its result), and the result's way back to the parent's task. Each phase runs from one
event to the next one the call waits for, so the phases add up to the call; a phase that
includes waiting for a poller says so ("scheduled → completed").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.report import Table
from bench.turns import runs_of
from turnkeep.contract.activity_io import CALL_TOOL

_WFT_SCHEDULED = EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
_WFT_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
_ACTIVITY_SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
_ACTIVITY_COMPLETED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
_CHILD_INITIATED = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
_CHILD_COMPLETED = EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED
_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED

FUNCTION_PHASES = (
    "the tool's activity (scheduled → completed)",
    "the parent's task on the result (scheduled → completed)",
)
AGENT_PHASES = (
    "the child's start (until its first task is scheduled)",
    "the child's first task, local set-up (scheduled → completed)",
    "the child's model call (the activity, scheduled → completed)",
    "the child's last task (scheduled → completed)",
    "the result to the parent's task (child completed → parent's task completed)",
)


def _gaps(*events: HistoryEvent) -> tuple[float, ...]:
    """Milliseconds from each event to the next, by the server's event times."""
    times = [e.event_time.ToNanoseconds() for e in events]
    return tuple((b - a) / 1e6 for a, b in pairwise(times))


def _first(events: Sequence[HistoryEvent], kind: int, after: int = 0) -> int:
    return next(i for i in range(after, len(events)) if events[i].event_type == kind)


def _last(events: Sequence[HistoryEvent], kind: int, before: int) -> int:
    return next(i for i in range(before - 1, -1, -1) if events[i].event_type == kind)


def function_phases(parent: Sequence[HistoryEvent]) -> tuple[float, ...]:
    """The phases of the parent's one function-tool call (its one ``call_tool`` activity)."""
    tool_scheduled = next(
        i
        for i, e in enumerate(parent)
        if e.event_type == _ACTIVITY_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == CALL_TOOL
    )
    tool_done = next(
        i
        for i, e in enumerate(parent)
        if e.event_type == _ACTIVITY_COMPLETED
        and e.activity_task_completed_event_attributes.scheduled_event_id
        == parent[tool_scheduled].event_id
    )
    asked = _last(parent, _WFT_COMPLETED, tool_scheduled)
    next_scheduled = _first(parent, _WFT_SCHEDULED, tool_done)
    next_done = _first(parent, _WFT_COMPLETED, next_scheduled)
    return _gaps(parent[asked], parent[tool_done], parent[next_done])


def agent_phases(
    parent: Sequence[HistoryEvent], child: Sequence[HistoryEvent]
) -> tuple[float, ...]:
    """The phases of the parent's one agent call, whose child turn's history is ``child``."""
    initiated = _first(parent, _CHILD_INITIATED)
    asked = _last(parent, _WFT_COMPLETED, initiated)
    returned = _first(parent, _CHILD_COMPLETED, initiated)
    parent_done = _first(parent, _WFT_COMPLETED, returned)
    first_scheduled = _first(child, _WFT_SCHEDULED)
    first_done = _first(child, _WFT_COMPLETED, first_scheduled)
    model_done = _first(child, _ACTIVITY_COMPLETED, first_done)
    ended = _first(child, _COMPLETED, model_done)
    return _gaps(
        parent[asked],
        child[first_scheduled],
        child[first_done],
        child[model_done],
        child[ended],
        parent[parent_done],
    )


@dataclass(frozen=True)
class Phases:
    function: list[tuple[float, ...]]
    agent: list[tuple[float, ...]]


async def read_phases(
    client: Client, function_ids: Sequence[str], agent_ids: Sequence[str]
) -> Phases:
    """The phases of the function-tool turns ``function_ids`` and of the agent-call turns
    ``agent_ids`` (workflow ids of single-run turns)."""
    function = [function_phases((await runs_of(client, w))[0]) for w in function_ids]
    agent = []
    for parent_id in agent_ids:
        parent = (await runs_of(client, parent_id))[0]
        start = parent[_first(parent, _CHILD_INITIATED)]
        child_id = start.start_child_workflow_execution_initiated_event_attributes.workflow_id
        child = (await runs_of(client, child_id))[0]
        agent.append(agent_phases(parent, child))
    return Phases(function, agent)


def phases_table(p: Phases) -> Table:
    table = Table(
        "Agents as tools: where a call's time goes (server event times)",
        ["call", "phase", "ms, median"],
    )
    for name, labels, rows in (
        ("function tool", FUNCTION_PHASES, p.function),
        ("agent", AGENT_PHASES, p.agent),
    ):
        for i, label in enumerate(labels):
            table.add(name, label, f"{statistics.median(r[i] for r in rows):.1f}")
        table.add(name, "**the call**", f"**{statistics.median(sum(r) for r in rows):.1f}**")
    table.notes.append(
        f"{len(p.function)} turns of each, after the overhead rounds: the parent's model "
        "answer's workflow task completed to the workflow task on the call's result completed, "
        "cut at the events named, from the event times the server recorded (its clock; a "
        "call's phases add up to it, their medians need not). A child's start includes the "
        "server's work: creating the child, recording it started in the parent (which wakes "
        "the parent for a workflow task of its own), then scheduling the child's first task."
    )
    return table
