"""Live deltas of a model call: what a provider emits while it streams, and how the address of
a call's live stream reaches a client (the ``llm_step`` heartbeat details).

A provider streams when ``delta_sink()`` returns a sink: ``llm_step`` sets one (a context
variable) around ``complete_model`` while the worker serves live streams
(``turnkeep.worker.live_server``). A context variable rather than a new method on
``ModelProvider``: the providers that wrap ``complete_model`` (Azure's deployment, the
compatible providers' key message) keep working unchanged, and a third party's provider that
never looks at the sink answers without streaming, as before. Nothing here reaches the
workflow: the final ``Message`` is what the non-streaming call returns, so history is the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol

from temporalio.converter import DataConverter

from turnkeep.contract.live_io import LiveAddress


class DeltaSink(Protocol):
    """Where a streaming provider sends what it receives, in order, as it receives it."""

    def text(self, text: str) -> None: ...

    def tool_call(self, name: str, call_id: str) -> None: ...


class LiveCallSink(DeltaSink, Protocol):
    """One attempt's stream on the worker's live server."""

    address: LiveAddress


class LiveServer(Protocol):
    """The worker's live-stream server (``turnkeep.worker.live_server``), as ``llm_step``
    uses it: a stream per attempt, its deltas encoded with ``converter``."""

    async def open(
        self, converter: DataConverter, call_index: int, attempt: int
    ) -> LiveCallSink: ...

    def close(self, call: LiveCallSink) -> None: ...

    async def aclose(self) -> None: ...


_SINK: ContextVar[DeltaSink | None] = ContextVar("turnkeep_delta_sink", default=None)


def delta_sink() -> DeltaSink | None:
    """The sink of the model call being made, if it is to be streamed."""
    return _SINK.get()


@contextlib.contextmanager
def streaming_to(sink: DeltaSink | None) -> Iterator[None]:
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)
