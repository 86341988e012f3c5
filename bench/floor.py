"""The floors turnkeep is measured against: bare workflows that do what a turn does, minus
turnkeep. In their own module because the workflow sandbox re-imports the module that defines
a workflow, and this one must import nothing but temporalio.

- ``Floor``: awaits ``activities`` activities one after another. With the ``noop`` activity it
  is the floor of the loop; the other activities add one thing a turn's activity does (a
  heartbeat, a query of its workflow, a 5 KB result) to measure what that one thing costs, and
  ``outcome_timer`` adds a long timer started after each step and cancelled after the next
  (as a turn records a model call's outcome).
- ``TimerFloor``: sleeps ``timers`` short timers one after another (dev-server flags).
- ``Floor`` with the ``wait`` activity: a workflow waiting on a slow activity (worker memory).
- ``SessionFloor``: a session's turns minus turnkeep: each message an update that starts a
  child workflow (``SessionFloorTurn``, which returns at once) and returns once it has
  started, the next message taken once the child has ended: the same workflow tasks per turn
  as a ``SessionWorkflow`` (replaying a session run).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow

NOOP = "noop"
HEARTBEAT = "noop_heartbeat"
QUERY = "noop_query"
BLOB = "blob_result"
WAIT = "wait"
STEP_QUERY = "step"

# Activities started so far by this process's `wait` (the memory bench's floor worker reports
# it, so the bench knows when every workflow is waiting).
waiting = 0


@activity.defn(name=NOOP)
async def noop() -> None:
    return None


@activity.defn(name=HEARTBEAT)
async def noop_heartbeat() -> None:
    activity.heartbeat("working")  # as every turnkeep activity does when it starts


@activity.defn(name=QUERY)
async def noop_query() -> None:
    """Reads its workflow's state back by query, as ``llm_step`` reads its input."""
    info = activity.info()
    assert info.workflow_id is not None, "scheduled by a workflow"
    handle = activity.client().get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
    await handle.query(STEP_QUERY)


@activity.defn(name=BLOB)
async def blob_result() -> str:
    return "x" * 5 * 1024


@activity.defn(name=WAIT)
async def wait() -> None:
    global waiting
    waiting += 1
    await asyncio.sleep(24 * 3600)  # until cancelled or the workflow is terminated


ACTIVITIES = [noop, noop_heartbeat, noop_query, blob_result, wait]


@dataclass(frozen=True)
class FloorInput:
    activities: int
    activity: str = NOOP
    heartbeat_seconds: float | None = None
    outcome_timer: bool = False


@workflow.defn(name="Floor")
class Floor:
    def __init__(self) -> None:
        self._step = 0

    @workflow.run
    async def run(self, spec: FloorInput) -> None:
        heartbeat = timedelta(seconds=spec.heartbeat_seconds) if spec.heartbeat_seconds else None
        timer: asyncio.Task[None] | None = None
        for step in range(spec.activities):
            self._step = step
            await workflow.execute_activity(
                spec.activity,
                start_to_close_timeout=timedelta(days=1),
                heartbeat_timeout=heartbeat,
            )
            if spec.outcome_timer:
                if timer is not None:
                    timer.cancel()
                timer = asyncio.ensure_future(workflow.sleep(timedelta(days=1), summary="step"))

    @workflow.query(name=STEP_QUERY)
    def step(self) -> int:
        return self._step


@workflow.defn(name="TimerFloor")
class TimerFloor:
    @workflow.run
    async def run(self, timers: int, seconds: float) -> None:
        for _ in range(timers):
            await workflow.sleep(seconds)


@workflow.defn(name="SessionFloorTurn")
class SessionFloorTurn:
    @workflow.run
    async def run(self, text: str) -> str:
        return text


@workflow.defn(name="SessionFloor")
class SessionFloor:
    def __init__(self) -> None:
        self._queue: list[tuple[int, str]] = []
        self._sent = 0
        self._started = 0

    @workflow.update(name="send")
    async def send(self, text: str) -> int:
        self._sent += 1
        turn = self._sent
        self._queue.append((turn, text))
        await workflow.wait_condition(lambda: self._started >= turn)
        return turn

    @workflow.run
    async def run(self, turns: int) -> None:
        for _ in range(turns):
            await workflow.wait_condition(lambda: bool(self._queue))
            turn, text = self._queue.pop(0)
            child = await workflow.start_child_workflow(
                SessionFloorTurn.run, text, id=f"{workflow.info().workflow_id}/turn-{turn}"
            )
            self._started = turn
            await child
