"""A follower's query that reached a worker too starved of CPU to answer in time (the SDK's
deadlock detector failed it: ``[TMPRL1101] Potential deadlock detected``) is asked again, not
raised to the follower, by ``poll_query`` and ``query_retrying`` alike; any other failed query
is raised at once. So is one the server would not hold while a worker ran the workflow's task.

A real worker cannot be starved on purpose without leaving it unable to evict the workflow
(the SDK then hangs its shutdown), so the handle here is a stand-in that fails as the client
does: with the ``WorkflowQueryFailedError`` the SDK raises for that server answer. Every ask
is bounded in time, and a follower tells a run that continued as new from the last one, on the
real dev server."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from tests.rerun_workflow import RerunWorkflow
from turnkeep.client.queries import (
    ASK_TIMEOUT,
    BUSY_SECONDS,
    POLL_LAST,
    poll_query,
    query_retrying,
    worth_asking_again,
)
from turnkeep.devserver.embedded import ServerInfo

STARVED = "[TMPRL1101] Potential deadlock detected: workflow didn't yield within 2 second(s)."


@dataclass
class _Described:
    status: WorkflowExecutionStatus = WorkflowExecutionStatus.RUNNING
    history_length: int = 0
    run_id: str = "run-1"


@dataclass
class _Handle:
    failures: list[str]
    asked: int = 0
    length: int = field(default=0)
    run_id: str | None = None
    bounds: list[timedelta | None] = field(default_factory=list)

    async def describe(self, **kwargs: Any) -> _Described:
        self.bounds.append(kwargs.get("rpc_timeout"))
        self.length += 1  # every look sees news
        return _Described(history_length=self.length)

    async def query(self, *args: Any, **kwargs: Any) -> int:
        self.asked += 1
        self.bounds.append(kwargs.get("rpc_timeout"))
        if self.failures:
            failure = self.failures.pop(0)
            if failure in _RPC:
                raise RPCError(failure, _RPC[failure], b"")
            raise WorkflowQueryFailedError(failure)
        return 7


# What the server answers a query it would not hold, or gave up waiting on a worker for.
_RPC = {
    "busy": RPCStatusCode.RESOURCE_EXHAUSTED,
    "timeout": RPCStatusCode.CANCELLED,
}


async def test_a_starved_worker_is_asked_again() -> None:
    handle = _Handle([STARVED])
    assert await query_retrying(handle, "q", None) == 7  # type: ignore[arg-type]
    assert handle.asked == 2
    handle = _Handle([STARVED, STARVED])
    found: int | None = await poll_query(handle, "q", lambda n: n == 7)  # type: ignore[arg-type]
    assert found == 7
    assert handle.asked == 3


async def test_a_query_that_failed_otherwise_is_raised() -> None:
    for ask in (
        lambda h: query_retrying(h, "q", None),
        lambda h: poll_query(h, "q", lambda n: True),
    ):
        handle = _Handle(["no such query: q"])
        with pytest.raises(WorkflowQueryFailedError, match="no such query"):
            await ask(handle)
        assert handle.asked == 1


async def test_a_query_the_server_would_not_hold_is_asked_again() -> None:
    """The server holds one query at a time while a worker runs the workflow's task: the
    next ask is answered (a door would otherwise take a turn that waits for one that works)."""
    handle = _Handle(["busy", "busy"])
    assert await query_retrying(handle, "q") == 7  # type: ignore[arg-type]
    assert handle.asked == 3


async def test_a_caller_bounding_the_query_keeps_its_timeout() -> None:
    handle = _Handle(["timeout"])
    with pytest.raises(RPCError):
        await query_retrying(handle, "q", rpc_timeout=timedelta(seconds=1))  # type: ignore[arg-type]
    assert handle.asked == 1
    handle = _Handle(["timeout"])
    assert await query_retrying(handle, "q") == 7  # type: ignore[arg-type]


async def test_no_ask_waits_forever() -> None:
    """The SDK bounds no query, and the server can hold one for as long as it waits on a
    workflow task: every ask a follower makes is bounded, and one that ran out is asked again."""
    handle = _Handle(["timeout"])
    found: int | None = await poll_query(handle, "q", lambda n: n == 7)  # type: ignore[arg-type]
    assert found == 7
    assert handle.asked == 2
    assert handle.bounds and set(handle.bounds) == {ASK_TIMEOUT}
    handle = _Handle(["timeout"])
    assert await query_retrying(handle, "q") == 7  # type: ignore[arg-type]
    assert handle.bounds == [ASK_TIMEOUT, ASK_TIMEOUT]


async def test_a_run_that_continued_as_new_is_asked_at_the_length_the_last_was(
    temporal: ServerInfo,
) -> None:
    """Each run of ``RerunWorkflow`` comes to rest at the same history length, as a session
    between turns does: the follower, last answered by the first run at that length, still
    asks the next run (it tells runs apart, not only lengths)."""
    client = await Client.connect(temporal.address, namespace=temporal.namespace)
    queue = f"rerun-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[RerunWorkflow]):
        handle = await client.start_workflow(
            RerunWorkflow.run, 0, id=f"rerun-{queue}", task_queue=queue
        )

        def continued(number: int | None) -> bool:
            return number is not None and number > 0

        follower = asyncio.create_task(poll_query(handle, RerunWorkflow.number, continued))
        # The follower asks the first run, at rest, and backs off to its longest wait.
        await asyncio.sleep(2 * BUSY_SECONDS + POLL_LAST)
        assert not follower.done()
        await handle.signal(RerunWorkflow.go)
        async with asyncio.timeout(10):
            answer = await follower
        assert answer == 1
        await handle.terminate()


def test_one_policy_says_what_is_asked_again() -> None:
    """What every ask of a follower retries: the server giving up on the query or not holding
    it, and a starved worker; a caller bounding the query's time keeps only the refusals that
    came before its time ran out."""
    gave_up = RPCError("timeout", RPCStatusCode.CANCELLED, b"")
    busy = RPCError("busy", RPCStatusCode.RESOURCE_EXHAUSTED, b"")
    assert worth_asking_again(gave_up) and worth_asking_again(busy)
    assert worth_asking_again(busy, bounded=True)
    assert not worth_asking_again(gave_up, bounded=True)
    assert worth_asking_again(WorkflowQueryFailedError(STARVED))
    assert not worth_asking_again(WorkflowQueryFailedError("no such query: q"))
    assert not worth_asking_again(RPCError("gone", RPCStatusCode.NOT_FOUND, b""))
    assert not worth_asking_again(ValueError("not a query's failure"))
