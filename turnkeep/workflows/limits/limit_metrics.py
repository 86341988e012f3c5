"""The metrics of limits, recorded through ``workflow.metric_meter()`` (nothing while a workflow
replays): the wait of each limited model call (turn side) and what each limit has in use
(limiter side)."""

from __future__ import annotations

from temporalio import workflow

from turnkeep.workflows.metrics import LIMIT_REQUESTS_IN_USE, LIMIT_TOKENS_IN_USE, LIMIT_WAIT


def waited(limit: str, priority: str, seconds: float) -> None:
    histogram = workflow.metric_meter().create_histogram_float(
        LIMIT_WAIT.name, LIMIT_WAIT.help, LIMIT_WAIT.unit
    )
    histogram.record(max(0.0, seconds), {"limit": limit, "priority": priority})


def in_use(limit: str, requests: int, tokens: int) -> None:
    meter = workflow.metric_meter()
    labels = {"limit": limit}
    meter.create_gauge(
        LIMIT_REQUESTS_IN_USE.name, LIMIT_REQUESTS_IN_USE.help, LIMIT_REQUESTS_IN_USE.unit
    ).set(requests, labels)
    meter.create_gauge(
        LIMIT_TOKENS_IN_USE.name, LIMIT_TOKENS_IN_USE.help, LIMIT_TOKENS_IN_USE.unit
    ).set(tokens, labels)
