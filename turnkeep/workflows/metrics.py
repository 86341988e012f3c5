"""The catalogue of turnkeep's metrics: every name, kind, unit, label and help text, as a
Prometheus scrape of ``turnkeep worker --metrics`` shows them.

Metrics are recorded through the Temporal SDK's metric meter (``workflow.metric_meter()`` in
workflow code, which records nothing while replaying; ``activity.metric_meter()`` in
activities), so they reach whatever exporter the worker's ``Runtime`` has. The SDK adds its own
labels to each: ``namespace``, ``task_queue`` and ``workflow_type`` (workflow side) or
``activity_type`` (activity side), and any global tags of the runtime; the catalogue lists the
labels turnkeep adds.

Names as scraped: the SDK's Prometheus exporter adds no ``_total`` to counters and no unit
suffix (``PrometheusConfig`` defaults, which ``turnkeep worker`` keeps, as Temporal's own
dashboards expect), histograms come out as ``<name>_bucket``, ``<name>_sum`` and
``<name>_count``, durations are in milliseconds, and every series also has the label
``service_name="temporal-core-sdk"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MetricKind(StrEnum):
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    GAUGE = "gauge"


@dataclass(frozen=True)
class MetricSpec:
    """One metric; ``name`` as scraped (a histogram's series add ``_bucket``, ``_sum`` and
    ``_count``)."""

    name: str
    kind: MetricKind
    unit: str  # "1" for counts, "ms" for durations (the exporter's default), "By" for bytes
    labels: tuple[str, ...]
    help: str
    # Where it is recorded: "workflow" (the workflow meter: nothing while replaying),
    # "activity" (the activity meter) or "worker" (the runtime's meter, by the worker's
    # payload storage).
    side: str
    # Bucket boundaries ``turnkeep worker`` gives a histogram (the SDK's default,
    # 50/100/500/1000/2500/10000, suits neither iteration counts nor fast tools).
    buckets: tuple[float, ...] = ()


TURNS_STARTED = MetricSpec(
    "turnkeep_turns_started",
    MetricKind.COUNTER,
    "1",
    ("agent",),
    "Turns started (a turn continued as new is counted once).",
    "workflow",
)
TURNS_ENDED = MetricSpec(
    "turnkeep_turns_ended",
    MetricKind.COUNTER,
    "1",
    ("agent", "stop_reason"),
    "Turns ended, by stop reason (endTurn, maxIterations, error, cancelled, ...; "
    "failed: the workflow itself failed, e.g. an unknown agent).",
    "workflow",
)
TURN_ITERATIONS = MetricSpec(
    "turnkeep_turn_iterations",
    MetricKind.HISTOGRAM,
    "1",
    ("agent",),
    "Tool-call iterations per ended turn.",
    "workflow",
    (0, 1, 2, 3, 5, 10, 20, 50, 100, 200),
)
APPROVALS_REQUESTED = MetricSpec(
    "turnkeep_approvals_requested",
    MetricKind.COUNTER,
    "1",
    ("agent",),
    "Tool calls held for a person's approval. Minus turnkeep_approvals_resolved: the calls "
    "awaiting approval now.",
    "workflow",
)
APPROVALS_RESOLVED = MetricSpec(
    "turnkeep_approvals_resolved",
    MetricKind.COUNTER,
    "1",
    ("agent", "decision"),
    "Tool calls no longer awaiting approval, by decision (approve, deny, timeout; "
    "cancelled: the turn was cancelled while the call waited).",
    "workflow",
)
MODEL_CALL_LATENCY = MetricSpec(
    "turnkeep_model_call_latency",
    MetricKind.HISTOGRAM,
    "ms",
    ("model",),
    "Duration of each model call attempt (llm_step), successful or not.",
    "activity",
    (100, 250, 500, 1000, 2500, 5000, 10000, 20000, 40000, 80000, 160000),
)
MODEL_CALL_ERRORS = MetricSpec(
    "turnkeep_model_call_errors",
    MetricKind.COUNTER,
    "1",
    ("model", "error"),
    "Failed model call attempts, by error class: the type turnkeep gives the failure "
    "(ProviderRateLimited, ProviderOverloaded, ProviderTimeout, ...), else the exception's "
    "class name. A retried call counts once per failed attempt.",
    "activity",
)
TOKENS = MetricSpec(
    "turnkeep_tokens",
    MetricKind.COUNTER,
    "1",
    ("model", "kind"),
    "Tokens reported by the provider, by kind: input, output, cache_read, cache_write.",
    "activity",
)
COST = MetricSpec(
    "turnkeep_cost_micro_usd",
    MetricKind.COUNTER,
    "1",
    ("model",),
    "What model calls cost by the worker's price table, in millionths of a US dollar (a "
    "counter takes whole numbers: divide by 1e6), by model. A call of a model with no price "
    "adds nothing here and one to turnkeep_unpriced_model_calls.",
    "activity",
)
UNPRICED_CALLS = MetricSpec(
    "turnkeep_unpriced_model_calls",
    MetricKind.COUNTER,
    "1",
    ("model",),
    "Model calls whose cost is unknown: their model has no price (set one in `prices:`).",
    "activity",
)
TOOL_CALL_LATENCY = MetricSpec(
    "turnkeep_tool_call_latency",
    MetricKind.HISTOGRAM,
    "ms",
    ("tool",),
    "Duration of each tool call attempt (call_tool), by tool (server__tool).",
    "activity",
    (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000),
)
TOOL_CALL_ERRORS = MetricSpec(
    "turnkeep_tool_call_errors",
    MetricKind.COUNTER,
    "1",
    ("tool",),
    "Tool calls that failed or returned an error result (isError), by tool.",
    "activity",
)
PAYLOAD_BYTES_STORED = MetricSpec(
    "turnkeep_payload_bytes_stored",
    MetricKind.COUNTER,
    "By",
    ("driver",),
    "Bytes written to external payload storage (payloads above the threshold).",
    "worker",
)
LIMIT_WAIT = MetricSpec(
    "turnkeep_limit_wait_seconds",
    MetricKind.HISTOGRAM,
    "s",
    ("limit", "priority"),
    "How long a model call of a limited model waited for its limit's capacity (`limits:`), "
    "by limit and the turn's priority; a call granted at once waited 0.",
    "workflow",
    (0, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
)
LIMIT_REQUESTS_IN_USE = MetricSpec(
    "turnkeep_limit_requests_in_use",
    MetricKind.GAUGE,
    "1",
    ("limit",),
    "Model calls granted by a limit in the last 60 s (against its requests_per_minute).",
    "workflow",
)
LIMIT_TOKENS_IN_USE = MetricSpec(
    "turnkeep_limit_tokens_in_use",
    MetricKind.GAUGE,
    "1",
    ("limit",),
    "Tokens a limit's calls took in the last 60 s (estimated until each call settles to the "
    "provider's usage; against its tokens_per_minute).",
    "workflow",
)
PROVIDER_RATE_LIMITED = MetricSpec(
    "turnkeep_provider_rate_limited",
    MetricKind.COUNTER,
    "1",
    ("provider", "model"),
    "Model call attempts a provider answered 429 (rate limited) or 529 (overloaded).",
    "activity",
)

CATALOGUE: tuple[MetricSpec, ...] = (
    TURNS_STARTED,
    TURNS_ENDED,
    TURN_ITERATIONS,
    APPROVALS_REQUESTED,
    APPROVALS_RESOLVED,
    MODEL_CALL_LATENCY,
    MODEL_CALL_ERRORS,
    TOKENS,
    COST,
    UNPRICED_CALLS,
    TOOL_CALL_LATENCY,
    TOOL_CALL_ERRORS,
    PAYLOAD_BYTES_STORED,
    LIMIT_WAIT,
    LIMIT_REQUESTS_IN_USE,
    LIMIT_TOKENS_IN_USE,
    PROVIDER_RATE_LIMITED,
)


def histogram_buckets() -> dict[str, list[float]]:
    """``PrometheusConfig.histogram_bucket_overrides`` for turnkeep's histograms."""
    return {m.name: list(m.buckets) for m in CATALOGUE if m.buckets}
