"""Asking a workflow by query, as a client that follows it does: one policy for a query worth
asking again (``worth_asking_again``), used by a single ask (``query_retrying``) and by a
follower that asks until an answer holds (``poll_query``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.api.enums.v1 import PendingWorkflowTaskState
from temporalio.client import (
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.common import QueryRejectCondition
from temporalio.service import RPCError, RPCStatusCode

_QUERY_ATTEMPTS = 3
# A query the server gave up on (a busy worker, or a run that has just continued as new and
# answers once a worker has run its first task), or would not hold (it holds one query at a
# time while a worker runs the workflow's task: RESOURCE_EXHAUSTED), is worth asking again;
# the SDK reports its own RPC timeout as CANCELLED ("Timeout expired").
_RETRYABLE_QUERY = (
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.CANCELLED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
)
# For a caller that bounds the query's time: only what the server answered before the time
# ran out, so that asking again does not multiply the caller's bound.
_RETRYABLE_BOUNDED_QUERY = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.RESOURCE_EXHAUSTED)
# A query that reached a worker too starved of CPU to answer in time: its workflow code did
# not yield within the SDK's deadlock timeout (the SDK's error code). The next ask is answered.
_DEADLOCK_DETECTED = "[TMPRL1101]"
# How long one ask may take when its caller sets no bound. The SDK sets none, and the server
# can hold a query with no deadline for as long as it waits on a workflow task (a run that has
# just continued as new, a worker gone); an ask that ran out is asked again like one the
# server gave up on, so a follower never waits on one ask forever.
ASK_TIMEOUT = timedelta(seconds=30)


# How long a follower waits between two looks that brought no news: the first wait short, as
# a step's next message often follows within milliseconds, then doubling up to the last; but
# no longer than POLL_BUSY while the workflow's history grew within BUSY_SECONDS, as it does
# all through a turn of quick steps. A wait that doubles past a step's length would otherwise
# add up to its own length to when the follower sees the step's end.
POLL_FIRST = 0.01
POLL_BUSY = 0.04
POLL_LAST = 0.5
BUSY_SECONDS = 1.0
# How long a follower holds its query back while a worker runs one of the workflow's tasks
# (``poll_query``'s ``hold``), and how often it looks meanwhile.
TASK_WAIT = 1.0
TASK_POLL = 0.005

T = TypeVar("T")
_CONTINUED = WorkflowExecutionStatus.CONTINUED_AS_NEW


def worth_asking_again(err: Exception, *, bounded: bool = False) -> bool:
    """Whether a query that failed with ``err`` is worth asking again: the server gave up on
    it or would not hold it, or it reached a worker too starved to answer; not the workflow
    refusing it. ``bounded``: the caller bounds the query's time (``rpc_timeout``), which a
    query the server gave up on has used up."""
    if isinstance(err, RPCError):
        return err.status in (_RETRYABLE_BOUNDED_QUERY if bounded else _RETRYABLE_QUERY)
    return isinstance(err, WorkflowQueryFailedError) and str(err).startswith(_DEADLOCK_DETECTED)


async def query_retrying(
    handle: WorkflowHandle[Any, Any], query: Any, *args: Any, **options: Any
) -> Any:
    """``handle.query(query, *args, **options)``, asked again after a pause (up to
    ``_QUERY_ATTEMPTS`` times) while the failure is worth it (``worth_asking_again``). A
    caller that bounds the query's time (``rpc_timeout``) has its timeout kept, not
    multiplied; one that does not has each ask bounded by ``ASK_TIMEOUT``."""
    bounded = options.get("rpc_timeout") is not None
    options.setdefault("rpc_timeout", ASK_TIMEOUT)
    attempt = 1
    while True:
        try:
            return await handle.query(query, *args, **options)
        except (RPCError, WorkflowQueryFailedError) as err:
            task = asyncio.current_task()
            if (
                attempt >= _QUERY_ATTEMPTS
                or not worth_asking_again(err, bounded=bounded)
                or (task is not None and task.cancelling())
            ):
                raise
            await asyncio.sleep(POLL_FIRST * attempt)  # the task it waited behind may end
            attempt += 1


async def poll_query(
    handle: WorkflowHandle[Any, Any],
    query: Any,
    until: Callable[[T], bool],
    *,
    hold: bool = False,
) -> T | None:
    """Ask ``query`` of the workflow until ``until`` holds for its answer; None once the
    workflow has closed.

    Between asks the follower looks at the workflow's history length (``describe``, which the
    server answers alone) and asks again only once it has grown: nothing in the workflow can
    have changed without an event, and a query reaches a worker, which replays a workflow out
    of its cache to answer (as a turn waiting for a person is). Followers ask by query rather
    than by a long-poll update: a query writes nothing to history, and an update that reaches
    a workflow in the task after one that timed out can be recorded in an order its replay
    does not reproduce (a defect of Temporal's Core SDK; the design notes' *A known SDK
    defect*). A failed ask worth asking again (``worth_asking_again``) is asked again at the
    next look.

    With ``hold`` (a workflow that may close at any step: a turn), it does not ask while a
    worker runs one of the workflow's tasks either (for up to ``TASK_WAIT`` after the history
    last grew): the server would hold the query until the task ends, and when that task closes
    the workflow (a turn's last step: what its follower waits for), the worker has let the run
    go and replays its whole history to answer. The task's end shows in the next look, as the
    history grows or the workflow closes."""
    delay = POLL_FIRST
    # The run and its history length when last asked, and at the last look: a run that
    # continued as new starts its history again, and can come to rest at the very length at
    # which its previous run was last asked (a session between turns does, run after run).
    asked_at: tuple[str, int] | None = None
    seen: tuple[str, int] | None = None
    clock = asyncio.get_running_loop().time
    grew_at = clock()
    while True:
        try:
            described = await handle.describe(rpc_timeout=ASK_TIMEOUT)
        except RPCError as err:
            if not worth_asking_again(err):
                raise
            await asyncio.sleep(delay)
            continue
        look = (described.run_id, described.history_length)
        if look != seen:
            seen, grew_at = look, clock()
        running = described.status == WorkflowExecutionStatus.RUNNING
        # A run that continued as new is followed by the next (describe and query reach the
        # latest run, but one may close between the two), unless the handle is pinned to it.
        if not running and (described.status != _CONTINUED or handle.run_id):
            return None
        if running and hold and _task_running(described) and clock() - grew_at < TASK_WAIT:
            await asyncio.sleep(TASK_POLL)
            continue
        if running and look != asked_at:
            try:
                answer: T = await handle.query(
                    query, reject_condition=QueryRejectCondition.NOT_OPEN, rpc_timeout=ASK_TIMEOUT
                )
            except WorkflowQueryRejectedError as err:
                if err.status != _CONTINUED:
                    return None
                # The run asked continued as new meanwhile: ask the next one.
            except (RPCError, WorkflowQueryFailedError) as err:
                if not worth_asking_again(err):
                    raise
            else:
                if until(answer):
                    return answer
                asked_at = look
                delay = POLL_FIRST
        await asyncio.sleep(delay)
        busy = clock() - grew_at < BUSY_SECONDS
        delay = min(delay * 2, POLL_BUSY if busy else POLL_LAST)


def _task_running(described: WorkflowExecutionDescription) -> bool:
    task = described.raw_description.pending_workflow_task
    return task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED
