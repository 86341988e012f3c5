"""``turnkeep worker`` as a service: it starts, serves until SIGTERM or SIGINT, then shuts
down gracefully, and says which phase it is in to the health endpoint
(``turnkeep.worker.health``) and the log.

On the first signal the readiness probe turns 503 at once, the worker stops polling, and the
activities it is running get the grace period (``--graceful-shutdown``,
``worker.graceful_shutdown``; 30 s by default) to finish and report their results, after which
the SDK cancels those still running (their calls are retried elsewhere). Then the process
exits 0. Workflow tasks need no grace: the server hands the worker's turns to another worker.
A second signal exits at once, with 128 + the signal's number, as a shell reports a process
killed by it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

from pydantic import ValidationError
from temporalio.worker import Worker

from turnkeep.config.files import ConfigError
from turnkeep.config.settings import WorkerSettings
from turnkeep.support.durations import describe_duration
from turnkeep.worker.build import TurnkeepWorkers
from turnkeep.worker.health import HealthServer, WorkerState

log = logging.getLogger(__name__)

T = TypeVar("T")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """A signal arrived before the worker polled: there is nothing to drain."""


_EXPECTED = {
    "graceful_shutdown": "graceful_shutdown must be a duration: 30s, 2m, or seconds",
    "health": "health must be HOST:PORT, e.g. 0.0.0.0:8080",
}


def worker_settings(
    configured: WorkerSettings, *, graceful_shutdown: str | None, health: str | None
) -> WorkerSettings:
    """The config file's ``worker`` section with the command line's flags over it."""
    given: dict[str, Any] = {}
    if graceful_shutdown is not None:
        given["graceful_shutdown"] = graceful_shutdown
    if health is not None:
        given["health"] = health
    try:
        merged = WorkerSettings.model_validate({**configured.model_dump(), **given})
    except ValidationError as err:
        fields = sorted({str(e["loc"][0]) for e in err.errors(include_input=False) if e["loc"]})
        raise ConfigError(
            "worker options: " + "; ".join(_EXPECTED.get(f, f"{f} is not valid") for f in fields)
        ) from None
    if merged.graceful_shutdown < timedelta(0):
        raise ConfigError("worker options: graceful_shutdown must not be negative")
    return merged


class WorkerService:
    """The life of one worker process, as an ``async with`` around everything the command does:

    ``async with service: client = await service.connecting(connect(...));
    async with service.serving(worker): await service.until_signalled()``.

    Entering installs the signal handlers and starts the health endpoint (when configured);
    a signal before the worker polls ends the block quietly (``Stopped``)."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.grace = settings.graceful_shutdown
        self.state = WorkerState()
        self.health = HealthServer(settings.health, self.state) if settings.health else None
        self._stop: asyncio.Event | None = None
        self._signalled: str | None = None

    async def __aenter__(self) -> WorkerService:
        _SDK_WORKER_LOG.addFilter(_SAID_ONCE_ALREADY)
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # Kept until the loop closes: a second signal while the worker drains must find them.
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        if self.health is not None:
            await self.health.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self.health is not None:
            await self.health.stop()
        _SDK_WORKER_LOG.removeFilter(_SAID_ONCE_ALREADY)
        return exc_type is not None and issubclass(exc_type, Stopped)

    @property
    def stop(self) -> asyncio.Event:
        if self._stop is None:
            raise RuntimeError("use the WorkerService with `async with` first")
        return self._stop

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._signalled is not None:
            log.warning(
                "second signal (%s): exiting now, without waiting for running activities "
                "(Temporal retries them on another worker once their heartbeat times out)",
                name,
            )
            _flush()
            os._exit(128 + sig)
        self._signalled = name
        if self.state.phase == "polling":
            log.info(
                "%s: not ready any more; the worker stops polling and gives running activities "
                "up to %s to finish (a second signal exits at once)",
                name,
                describe_duration(self.grace),
            )
        else:
            log.info("%s before the worker polled: stopping", name)
        self.state.shutting_down()
        self.stop.set()

    async def connecting(self, connection: Awaitable[T]) -> T:
        """``connection`` (the Temporal client), unless a signal comes first."""
        self.state.connecting()
        client = await self.unless_stopped(connection)
        log.debug("connected to Temporal")
        return client

    async def unless_stopped(self, step: Awaitable[T]) -> T:
        """What ``step`` returns; ``Stopped`` if a signal arrives first (``step`` is cancelled)."""
        task = asyncio.ensure_future(step)
        stopped = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise Stopped()
        return task.result()

    @asynccontextmanager
    async def serving(self, worker: Worker | TurnkeepWorkers) -> AsyncIterator[None]:
        """Run ``worker`` for the block (ready once it polls); on leaving, shut it down with
        the grace period, logging each phase."""
        overdue: asyncio.Task[None] | None = None
        draining_since = 0.0
        async with worker:
            # The worker polls once its run has checked the namespace (and turnkeep's plugin
            # its search attributes); a worker that fails there raises out of `async with`.
            await self.unless_stopped(_until_running(worker))
            self.state.polling(worker)
            queues = (
                worker.task_queues if isinstance(worker, TurnkeepWorkers) else [worker.task_queue]
            )
            log.info("polling task queue(s) %s", ", ".join(queues))
            yield
            self.state.shutting_down()
            log.info("stopped polling; waiting for running activities to finish")
            draining_since = time.monotonic()
            overdue = asyncio.create_task(self._warn_when_overdue())
        if overdue is not None:
            overdue.cancel()
            log.info("worker stopped after %.1f s of shutdown", time.monotonic() - draining_since)

    async def until_signalled(self) -> None:
        await self.stop.wait()

    async def _warn_when_overdue(self) -> None:
        await asyncio.sleep(self.grace.total_seconds())
        log.warning(
            "the %s grace period is over: cancelling the activities still running (Temporal "
            "retries them on another worker)",
            describe_duration(self.grace),
        )


class _SdkShutdownLines(logging.Filter):
    """The SDK logs ``Beginning worker shutdown`` once for each of its workers (one per task
    queue: the worker's and each agent's), where the service has said once, with the grace
    period, that it stops polling."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Beginning worker shutdown")


_SDK_WORKER_LOG = logging.getLogger("temporalio.worker._worker")
_SAID_ONCE_ALREADY = _SdkShutdownLines()


async def _until_running(worker: Worker | TurnkeepWorkers) -> None:
    # The SDK tells no event when its worker starts, only this flag.
    while not worker.is_running:  # noqa: ASYNC110
        await asyncio.sleep(0.05)


def _flush() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
