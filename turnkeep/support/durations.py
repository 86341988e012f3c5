"""Durations in words, for messages a person reads (logs, errors, the codec server's pages)."""

from __future__ import annotations

from datetime import timedelta


def describe_duration(span: timedelta) -> str:
    """A duration in words, to the unit that reads best."""
    seconds = span.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size or unit == "second":
            value = f"{seconds / size:.3g}"
            return f"{value} {unit}{'' if value == '1' else 's'}"
    raise AssertionError("unreachable")
