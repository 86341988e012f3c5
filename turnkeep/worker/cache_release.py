"""``CacheRelease``: a worker drops a turn from its workflow cache when the turn asks, because
it now waits only for people (``turnkeep/workflows/worker_cache.py`` says why and when).

Temporal's Python SDK has no public call for this. The worker's Core bridge has one,
``request_workflow_eviction``: the same request the cache makes when it is full and lets its
least recently used workflow go. Core carries it out once the workflow's current task is done.
It is reached through the ``Worker``'s private ``_bridge_worker``. Where that is missing (another
SDK version), turns stay cached as any workflow does, and ``tests/test_metrics.py`` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from temporalio import workflow
from temporalio.worker import (
    HandleQueryInput,
    Interceptor,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from turnkeep.workflows.turn_workflow import TurnWorkflow
from turnkeep.workflows.worker_cache import LEAVE_CACHE, leave_cache_after_query

logger = logging.getLogger(__name__)

Evict = Callable[[str], None]


class CacheRelease(Interceptor):
    """Registers ``LEAVE_CACHE`` for the workflows of every worker it is given, and carries it
    out on the worker serving the workflow's namespace and task queue (``serving``); after each
    query to a turn that still waits only for people, asks again."""

    def __init__(self) -> None:
        self._evictors: dict[tuple[str, str], list[Evict]] = {}

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        input.unsafe_extern_functions[LEAVE_CACHE] = self._leave_cache
        return _ReleaseAfterQueries

    @contextmanager
    def serving(self, worker: Worker) -> Iterator[None]:
        """While ``worker`` runs, its workflows' requests reach it."""
        evict = evictor(worker)
        if evict is None:  # pragma: no cover - another SDK version: turns stay cached
            yield
            return
        key = (worker.client.namespace, worker.task_queue)
        self._evictors.setdefault(key, []).append(evict)
        try:
            yield
        finally:
            self._evictors[key].remove(evict)

    def _leave_cache(self, namespace: str, task_queue: str, run_id: str) -> None:
        # Called from workflow code: nothing may escape into it, or the workflow task fails.
        for evict in self._evictors.get((namespace, task_queue), ()):
            try:
                evict(run_id)
            except Exception:  # a worker shutting down, say: the run just stays cached
                logger.debug("could not release workflow run %s from the cache", run_id)


class _ReleaseAfterQueries(WorkflowInboundInterceptor):
    async def handle_query(self, input: HandleQueryInput) -> Any:
        answer = await super().handle_query(input)
        # Turns only: the application's own workflows on the worker are not turnkeep's to move.
        turn = workflow.instance()
        if isinstance(turn, TurnWorkflow) and turn.awaits_only_people():
            leave_cache_after_query()
        return answer


def evictor(worker: Worker) -> Evict | None:
    """``worker``'s request to drop a run from its cache, if this SDK version has it."""
    bridge = getattr(worker, "_bridge_worker", None)
    evict = getattr(bridge, "request_workflow_eviction", None)
    return evict if callable(evict) else None
