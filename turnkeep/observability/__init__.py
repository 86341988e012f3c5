"""Observability: turnkeep's metrics (through the Temporal SDK's metric meter) and traces
(through the SDK's OpenTelemetry integration). Nothing here needs OpenTelemetry installed
until tracing is switched on."""
