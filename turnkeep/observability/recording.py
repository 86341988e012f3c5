"""Recording turnkeep's metrics (``turnkeep.workflows.metrics``) through the Temporal SDK's
metric meter, so they reach whatever exporter the worker's ``Runtime`` has.

The workflow side (turns, approvals) is ``turnkeep.workflows.turn_metrics``.

Activity side (model and tool calls): ``ActivityMetrics``, an activity interceptor timing each
``llm_step`` and ``call_tool`` attempt. Its instruments are made once per worker runtime and
activity type (making them costs far more than recording with them), with the labels the SDK
gives the activity meter (namespace, task queue, activity type).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.common import MetricCounter, MetricHistogramTimedelta, MetricMeter
from temporalio.exceptions import ApplicationError
from temporalio.runtime import Runtime
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from turnkeep.contract.activity_io import CALL_TOOL, LLM_STEP, ToolCallOutcome
from turnkeep.contract.messages import Message
from turnkeep.workflows.metrics import (
    COST,
    MODEL_CALL_ERRORS,
    MODEL_CALL_LATENCY,
    PAYLOAD_BYTES_STORED,
    PROVIDER_RATE_LIMITED,
    TOKENS,
    TOOL_CALL_ERRORS,
    TOOL_CALL_LATENCY,
    UNPRICED_CALLS,
    MetricSpec,
)

log = logging.getLogger(__name__)

# -- activity side ------------------------------------------------------------------------


@dataclass(frozen=True)
class _ModelInstruments:
    latency: MetricHistogramTimedelta
    errors: MetricCounter
    tokens: MetricCounter
    cost: MetricCounter
    unpriced: MetricCounter


@dataclass(frozen=True)
class _ToolInstruments:
    latency: MetricHistogramTimedelta
    errors: MetricCounter


_USAGE_KINDS = (
    ("input", "input_tokens"),
    ("output", "output_tokens"),
    ("cache_read", "cache_read_tokens"),
    ("cache_write", "cache_write_tokens"),
)


class ActivityMetrics(Interceptor):
    """Times each model and tool call attempt and counts its errors and tokens."""

    def __init__(self) -> None:
        # (runtime, namespace, task queue, activity type) -> instruments. The runtime is kept
        # in the key's value too, so its id is not reused while the entry lives.
        self._instruments: dict[tuple[int, str, str, str], tuple[Runtime, Any]] = {}
        self._lock = threading.Lock()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _MetricsInbound(next, self)

    def instruments(self, kind: str) -> Any:
        info = activity.info()
        runtime = activity.client().service_client.config.runtime or Runtime.default()
        key = (id(runtime), info.namespace, info.task_queue, kind)
        found = self._instruments.get(key)
        if found is not None:
            return found[1]
        meter = activity.metric_meter()
        made: _ModelInstruments | _ToolInstruments
        if kind == LLM_STEP:
            made = _ModelInstruments(
                latency=_latency(meter, MODEL_CALL_LATENCY),
                errors=_counter(meter, MODEL_CALL_ERRORS),
                tokens=_counter(meter, TOKENS),
                cost=_counter(meter, COST),
                unpriced=_counter(meter, UNPRICED_CALLS),
            )
        else:
            made = _ToolInstruments(
                latency=_latency(meter, TOOL_CALL_LATENCY), errors=_counter(meter, TOOL_CALL_ERRORS)
            )
        with self._lock:
            self._instruments[key] = (runtime, made)
        return made


def _counter(meter: MetricMeter, spec: MetricSpec) -> MetricCounter:
    return meter.create_counter(spec.name, spec.help, spec.unit)


def _latency(meter: MetricMeter, spec: MetricSpec) -> MetricHistogramTimedelta:
    return meter.create_histogram_timedelta(spec.name, spec.help, spec.unit)


def error_class(err: BaseException) -> str:
    """An error's class for a label: the type turnkeep gave an ``ApplicationError`` (e.g.
    ``ProviderRateLimited``), else the exception's class name. Never its text."""
    if isinstance(err, ApplicationError) and err.type:
        return err.type
    return type(err).__name__


class _MetricsInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, root: ActivityMetrics) -> None:
        super().__init__(next)
        self._root = root

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        kind = activity.info().activity_type
        if kind not in (LLM_STEP, CALL_TOOL) or not input.args:
            return await super().execute_activity(input)
        request = input.args[0]
        started = time.perf_counter()
        try:
            result = await super().execute_activity(input)
        except BaseException as err:
            self._record(kind, request, started, None, err)
            raise
        self._record(kind, request, started, result, None)
        return result

    def _record(
        self, kind: str, request: Any, started: float, result: Any, err: BaseException | None
    ) -> None:
        # Metrics must never fail the call they describe.
        try:
            self._measure(kind, request, started, result, err)
        except Exception:
            log.warning("could not record the metrics of a %s call", kind, exc_info=True)

    def _measure(
        self, kind: str, request: Any, started: float, result: Any, err: BaseException | None
    ) -> None:
        elapsed = timedelta(seconds=time.perf_counter() - started)
        instruments = self._root.instruments(kind)
        if kind == LLM_STEP:
            model = {"model": str(getattr(request, "model", ""))}
            instruments.latency.record(elapsed, model)
            if err is not None:
                instruments.errors.add(1, {**model, "error": error_class(err)})
            elif isinstance(result, Message):
                usage = result.channel_json("usage") or {}
                for label, field in _USAGE_KINDS:
                    count = usage.get(field)
                    if isinstance(count, int) and count > 0:
                        instruments.tokens.add(count, {**model, "kind": label})
                cost = usage.get("cost_usd")
                if isinstance(cost, int | float):
                    if (micros := round(cost * 1_000_000)) > 0:
                        instruments.cost.add(micros, model)
                else:
                    instruments.unpriced.add(1, model)
            return
        tool = {"tool": str(getattr(request, "name", ""))}
        instruments.latency.record(elapsed, tool)
        if err is not None or (isinstance(result, ToolCallOutcome) and result.result.is_error):
            instruments.errors.add(1, tool)


def rate_limited(provider: str, model: str) -> None:
    """A provider answered a model call 429 or 529 (from within the ``llm_step`` activity)."""
    try:
        counter = _counter(activity.metric_meter(), PROVIDER_RATE_LIMITED)
        counter.add(1, {"provider": provider, "model": model})
    except Exception:  # metrics must never fail the call they describe
        log.warning("could not count a rate-limited model call", exc_info=True)


# -- worker side --------------------------------------------------------------------------


# Payload storage runs in the data converter, outside any workflow or activity, so it records
# on the runtime of the last worker started in this process (else the default runtime).
_storage_runtime: Runtime | None = None


def set_storage_runtime(runtime: Runtime | None) -> None:
    """Called as a worker starts, with its client's runtime."""
    global _storage_runtime
    _storage_runtime = runtime


def payload_bytes_stored(driver: str, size: int) -> None:
    """Bytes written to external payload storage (only new writes: content already stored
    under the same digest is not written again)."""
    meter = (_storage_runtime or Runtime.default()).metric_meter
    _stored_counter(meter).add(size, {"driver": driver})


_STORED: dict[int, tuple[MetricMeter, MetricCounter]] = {}


def _stored_counter(meter: MetricMeter) -> MetricCounter:
    found = _STORED.get(id(meter))
    if found is None:
        found = _STORED[id(meter)] = (meter, _counter(meter, PAYLOAD_BYTES_STORED))
    return found[1]
