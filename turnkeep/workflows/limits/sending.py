"""Signals a workflow sends without waiting for them (a turn's settles and withdrawals, a
limiter's grants), each in a task of its own that the workflow keeps until it is done.

A send's coroutine is made when its task first runs, not when the task is made: a task the
workflow's event loop drops before running it (its run evicted from the worker's cache with
the send still queued) then leaves no coroutine behind that was never awaited, which Python
warns of when it collects one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from types import FrameType
from typing import Any

Send = Callable[[], Coroutine[Any, Any, None]]


def spawn(sending: set[asyncio.Task[None]], send: Send) -> None:
    """Run ``send()`` in a task kept in ``sending`` until it is done."""
    task = asyncio.ensure_future(_Deferred(send))
    sending.add(task)
    task.add_done_callback(sending.discard)


class _Deferred(Coroutine[Any, None, None]):
    """``make()``'s coroutine, made on the first step a task gives it."""

    def __init__(self, make: Send) -> None:
        self._make: Send | None = make
        self._running: Coroutine[Any, Any, None] | None = None

    def _started(self) -> Coroutine[Any, Any, None]:
        if self._running is None:
            assert self._make is not None, "a send that ended does not run again"
            self._running, self._make = self._make(), None
        return self._running

    def send(self, value: None) -> Any:
        return self._started().send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._running is None:
            # Cancelled before it ran: it ends as an unstarted coroutine does, without one.
            self._make = None
            raise typ if val is None else val
        if val is None and tb is None:
            return self._running.throw(typ)
        return self._running.throw(typ, val, tb)  # the older form, as it was given

    def close(self) -> None:
        self._make = None
        if self._running is not None:
            self._running.close()

    def __await__(self) -> Generator[Any, None, None]:
        return self._started().__await__()

    @property
    def cr_frame(self) -> FrameType | None:
        """The running send's frame, for a task's stack (a workflow's stack trace query)."""
        return getattr(self._running, "cr_frame", None)
