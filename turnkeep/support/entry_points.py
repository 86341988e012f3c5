"""Extensions from installed packages: the classes a distribution declares in one of
turnkeep's entry-point groups (``turnkeep.providers``, ``turnkeep.tool_sources``)."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any


def register_installed(register: Callable[[Any], None], group: str, what: str) -> None:
    """Load every entry point of ``group`` and ``register`` it. A broken one stops the worker
    with its name, rather than leaving its models or tools missing without a word."""
    for entry in entry_points(group=group):
        try:
            register(entry.load())
        except Exception as err:
            raise ValueError(
                f"{what} entry point {entry.name!r} ({entry.value}) of group {group!r} could "
                f"not be registered: {err}"
            ) from err
