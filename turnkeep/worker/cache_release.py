"""``CacheRelease``: a worker drops a turn or a session from its workflow cache when the
workflow asks, because it now waits for people (``turnkeep.workflows.worker_cache`` says
why and when).

Temporal's Python SDK has no public call for this. The worker's Core bridge has one
(``workflow_evictor`` reaches it): the same request the cache makes when it is full and lets
its least recently used workflow go. Core carries it out once the workflow's current task is
done. Where this SDK version does not let it be reached, workflows stay cached as any workflow
does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.worker import (
    HandleQueryInput,
    Interceptor,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from turnkeep.support.sdk_private import Evict, workflow_evictor
from turnkeep.workflows.session_workflow import SessionWorkflow
from turnkeep.workflows.turn_workflow import TurnWorkflow
from turnkeep.workflows.worker_cache import LEAVE_CACHE, When, ask_after_query

logger = logging.getLogger(__name__)


class CacheRelease(Interceptor):
    """Registers ``LEAVE_CACHE`` for the workflows of every worker it is given, and carries it
    out on the worker serving the workflow's namespace and task queue (``serving``); a session
    that is idle leaves ``idle_session_cache`` later (None: never). After each query to a turn
    or session that still waits, it asks again."""

    def __init__(self, idle_session_cache: timedelta | None) -> None:
        self._idle_after = idle_session_cache
        self._served: dict[tuple[str, str], list[_Served]] = {}

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        input.unsafe_extern_functions[LEAVE_CACHE] = self._leave_cache
        return _AskAfterQueries

    @contextmanager
    def serving(self, worker: Worker) -> Iterator[None]:
        """While ``worker`` runs (on this event loop), its workflows' requests reach it."""
        evict = workflow_evictor(worker)
        if evict is None:  # pragma: no cover - another SDK version: workflows stay cached
            yield
            return
        served = _Served(evict, asyncio.get_running_loop(), self._idle_after)
        key = (worker.client.namespace, worker.task_queue)
        self._served.setdefault(key, []).append(served)
        try:
            yield
        finally:
            self._served[key].remove(served)
            served.close()

    def _leave_cache(self, namespace: str, task_queue: str, run_id: str, when: When) -> None:
        # Called from workflow code: nothing may escape into it, or the workflow task fails.
        for served in self._served.get((namespace, task_queue), ()):
            try:
                served.ask(run_id, when)
            except Exception:  # a worker shutting down, say: the run just stays cached
                logger.debug("could not release workflow run %s from the cache", run_id)


class _Served:
    """One running worker: its eviction request, and the delayed ones pending, by run."""

    def __init__(
        self, evict: Evict, loop: asyncio.AbstractEventLoop, idle_after: timedelta | None
    ) -> None:
        self._evict = evict
        self._loop = loop
        self._idle_after = idle_after.total_seconds() if idle_after is not None else None
        self._later: dict[str, asyncio.TimerHandle] = {}  # on the loop's thread only

    def ask(self, run_id: str, when: When) -> None:
        """From a workflow's thread."""
        if when == "now":
            self._evict(run_id)  # Core holds it until the workflow's current task is done
        else:
            self._loop.call_soon_threadsafe(self._schedule, run_id, when)

    def _schedule(self, run_id: str, when: When) -> None:
        pending = self._later.pop(run_id, None)
        if pending is not None:
            pending.cancel()
        if when == "idle" and self._idle_after is not None:
            self._later[run_id] = self._loop.call_later(self._idle_after, self._due, run_id)

    def _due(self, run_id: str) -> None:
        del self._later[run_id]
        try:
            self._evict(run_id)
        except Exception:  # a worker shutting down, say
            logger.debug("could not release workflow run %s from the cache", run_id)

    def close(self) -> None:
        for pending in self._later.values():
            pending.cancel()
        self._later.clear()


class _AskAfterQueries(WorkflowInboundInterceptor):
    async def handle_query(self, input: HandleQueryInput) -> Any:
        answer = await super().handle_query(input)
        # Turns and sessions only: the application's own workflows are not turnkeep's to move.
        instance = workflow.instance()
        if isinstance(instance, TurnWorkflow) and instance.awaits_only_people():
            ask_after_query("now")
        elif isinstance(instance, SessionWorkflow) and instance.idle():
            ask_after_query("idle")
        return answer
