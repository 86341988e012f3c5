"""Turning observability on: the Prometheus endpoint of ``turnkeep worker`` (the Temporal SDK
runtime's own), the tracing interceptor ``TurnkeepPlugin`` adds, and the OTLP exporter of
``turnkeep worker`` (configured by the standard ``OTEL_*`` variables)."""

from __future__ import annotations

import importlib
import os
import re
from typing import Any

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import Interceptor

from turnkeep.config.settings import ObservabilitySettings
from turnkeep.observability.logs import core_log_forwarding
from turnkeep.workflows.metrics import histogram_buckets

OTEL_EXTRA = "turnkeep[otel]"
_ADDRESS = re.compile(r"^\S*:\d{1,5}$")


class ObservabilityError(RuntimeError):
    """Observability asked for something this installation cannot do."""


def metrics_runtime(bind_address: str) -> Runtime:
    """A Temporal runtime serving Prometheus metrics (the SDK's and turnkeep's) at
    ``http://<bind_address>/metrics``, with turnkeep's histogram buckets. A client made on it
    (``Client.connect(..., runtime=...)``) gives its workers' metrics to it. Its core logs
    through Python's logging (``core_log_forwarding``)."""
    if not _ADDRESS.match(bind_address):
        raise ObservabilityError(f"metrics address must be HOST:PORT, got {bind_address!r}")
    prometheus = PrometheusConfig(
        bind_address=bind_address, histogram_bucket_overrides=histogram_buckets()
    )
    return Runtime(telemetry=TelemetryConfig(metrics=prometheus, logging=core_log_forwarding()))


def tracing_interceptors(settings: ObservabilitySettings) -> list[Interceptor]:
    """What ``TurnkeepPlugin`` adds for traces: nothing unless ``observability.tracing``."""
    if not settings.tracing:
        return []
    try:
        from turnkeep.observability.tracing import TurnTracing
    except ImportError as err:
        raise ObservabilityError(
            f"observability.tracing is on but OpenTelemetry is not installed ({err}); "
            f"install {OTEL_EXTRA}"
        ) from None
    return [TurnTracing(trace_content=settings.trace_content)]


def start_worker_observability(
    settings: ObservabilitySettings, *, metrics: str | None = None
) -> list[str]:
    """For ``turnkeep worker``, before it connects: serve metrics at ``metrics`` (else
    ``settings.metrics``) through the default runtime, which the worker's client then uses,
    and, with tracing on, export spans over OTLP. Returns what it started, to print."""
    started: list[str] = []
    address = metrics or settings.metrics
    if address:
        Runtime.set_default(metrics_runtime(address), error_if_already_set=False)
        started.append(f"metrics at http://{address}/metrics")
    if settings.tracing:
        started.append(install_otlp_tracing())
    return started


def install_otlp_tracing() -> str:
    """Set the global tracer provider to one exporting over OTLP, as the ``OTEL_*`` variables
    say (endpoint, headers, protocol, service name and resource attributes), unless an
    application set one already. ``OTEL_TRACES_EXPORTER=console`` prints spans instead."""
    try:
        import opentelemetry.trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError as err:
        raise ObservabilityError(
            f"tracing needs OpenTelemetry ({err}); install {OTEL_EXTRA}"
        ) from None
    current = opentelemetry.trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return "traces to the application's tracer provider"
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip()
    exporter: SpanExporter
    if kind == "console":
        exporter = ConsoleSpanExporter()
    elif kind == "otlp":
        exporter = _otlp_exporter()
    else:
        raise ObservabilityError(f"OTEL_TRACES_EXPORTER={kind!r}: turnkeep knows otlp, console")
    provider = TracerProvider()  # service name and resource from OTEL_SERVICE_NAME etc.
    provider.add_span_processor(BatchSpanProcessor(exporter))
    opentelemetry.trace.set_tracer_provider(provider)
    return f"traces over {kind}"


def _otlp_exporter() -> Any:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    kind = "grpc" if protocol == "grpc" else "http"
    try:
        module = importlib.import_module(f"opentelemetry.exporter.otlp.proto.{kind}.trace_exporter")
    except ImportError as err:
        raise ObservabilityError(
            f"OTLP export ({protocol}) needs opentelemetry-exporter-otlp ({err}); install "
            f"{OTEL_EXTRA}"
        ) from None
    return module.OTLPSpanExporter()
