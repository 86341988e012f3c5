"""Turn metrics recorded by ``TurnWorkflow`` through ``workflow.metric_meter()``, which records
nothing while the workflow replays: a turn resumed on another worker is not counted twice.
Recording issues no command, so a turn's history is the same with or without it. Each happens
once or twice per turn, so the instruments are made when needed (the meter is the workflow's).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import MetricCounter, MetricMeter

from turnkeep.workflows.metrics import (
    APPROVALS_REQUESTED,
    APPROVALS_RESOLVED,
    TURN_ITERATIONS,
    TURNS_ENDED,
    TURNS_STARTED,
    MetricSpec,
)


def _counter(meter: MetricMeter, spec: MetricSpec) -> MetricCounter:
    return meter.create_counter(spec.name, spec.help, spec.unit)


def turn_started(agent: str) -> None:
    """A turn's first run began (not a run it continued as new into)."""
    _counter(workflow.metric_meter(), TURNS_STARTED).add(1, {"agent": agent})


def turn_ended(agent: str, stop_reason: str, iterations: int) -> None:
    meter = workflow.metric_meter()
    _counter(meter, TURNS_ENDED).add(1, {"agent": agent, "stop_reason": stop_reason})
    histogram = meter.create_histogram(
        TURN_ITERATIONS.name, TURN_ITERATIONS.help, TURN_ITERATIONS.unit
    )
    histogram.record(iterations, {"agent": agent})


def approval_requested(agent: str) -> None:
    _counter(workflow.metric_meter(), APPROVALS_REQUESTED).add(1, {"agent": agent})


def approval_resolved(agent: str, decision: str) -> None:
    attributes = {"agent": agent, "decision": decision}
    _counter(workflow.metric_meter(), APPROVALS_RESOLVED).add(1, attributes)
