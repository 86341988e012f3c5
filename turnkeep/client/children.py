"""The child turns a turn starts (its team's steps, its calls of agents as tools), as the
turn's own history records them: ``show`` lists them from a closed or running turn with no
worker, and ``TurnHandle.stream_with_children()`` follows them as they start and end.

A parent starts each child with a workflow id of its own below the parent's
(``<parent>/<step>/<name>``: ``agent_tools.child_id``), and its history holds the child's
start (with its input, which names the agent), run and close (with its result, which holds
its usage). Nothing here asks the workflow or a worker: reading the parent's events is enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.converter import DataConverter, WorkflowSerializationContext

from turnkeep.client.live import MessageEvent, StreamEvent, TextDelta, follow_live
from turnkeep.client.status import (
    TurnStatus,
    event_attributes,
    event_time,
    failure_of,
    ms_between,
)
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import WORKFLOW_NAME, Usage
from turnkeep.workflows.agent_tools import CALL_ID_CHARS

log = logging.getLogger(__name__)

# How long a follower of the parent may hold one of its messages back, waiting to have read
# the parent's history as far as the message: the steps that led to it print before it.
CATCH_UP_SECONDS = 5.0


class ChildTurn(BaseModel):
    """One child turn, as its parent's history records it."""

    workflow_id: str
    run_id: str | None = None  # None until the child has started
    agent: str | None = None  # None when its input could not be read
    # A team's step number, or for an agent called as a tool the model call that asked.
    step: int | None = None
    # A team's step name (its agent; ``<branch>-<agent>`` in a parallel), or the tool call's id.
    name: str
    # The parent's tool call it answers, when an agent was called as a tool.
    call_id: str | None = None
    status: TurnStatus
    started_at: datetime
    closed_at: datetime | None = None
    took_ms: float | None = None
    stop_reason: StopReason | None = None  # once it completed
    # Per model, with the agents it called as tools included; known once it completed.
    usage: dict[str, Usage] = Field(default_factory=dict)
    failure: str | None = None  # why it failed, or did not start


class ChildStarted(BaseModel):
    """The turn has started a child turn (a team's step, an agent called as a tool)."""

    kind: Literal["child_started"] = "child_started"
    child: ChildTurn


class ChildEnded(BaseModel):
    """A child turn has ended: ``child.status`` says how."""

    kind: Literal["child_ended"] = "child_ended"
    child: ChildTurn


class ChildText(BaseModel):
    """A piece of a running child turn's live text, as its provider streamed it."""

    kind: Literal["child_text"] = "child_text"
    workflow_id: str
    agent: str | None
    text: str


ChildEvent = ChildStarted | ChildEnded | ChildText
TurnEvent = StreamEvent | ChildEvent


class _ChildInput(BaseModel):
    """The part of a child's ``TurnInput`` that names its agent."""

    agent: str


class _ChildResult(BaseModel):
    """The part of a child's ``TurnResult`` that ``show`` prints."""

    stop_reason: StopReason | None = None
    usage: dict[str, Usage] = Field(default_factory=dict)


_CLOSED = {
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED: TurnStatus.COMPLETED,
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED: TurnStatus.FAILED,
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED: TurnStatus.CANCELLED,
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED: TurnStatus.TERMINATED,
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TIMED_OUT: TurnStatus.TIMED_OUT,
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED: TurnStatus.FAILED,
}


class ChildTracker:
    """The child turns of one run of a parent, from its events in order."""

    def __init__(self, client: Client, parent_id: str) -> None:
        self._client = client
        self._parent_id = parent_id
        self._children: dict[int, ChildTurn] = {}  # by the initiating event's id

    @property
    def children(self) -> list[ChildTurn]:
        return list(self._children.values())

    async def see(self, event: HistoryEvent) -> ChildEvent | None:
        """Take in the run's next event: the child it started or ended, if it did."""
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            attributes = event.start_child_workflow_execution_initiated_event_attributes
            if attributes.workflow_type.name != WORKFLOW_NAME:
                return None  # not a turn: nothing of ours
            child = self._new(attributes.workflow_id, event_time(event.event_time))
            child.agent = await self._agent(child.workflow_id, attributes.input)
            if child.step is not None and not _is_step(child.name, child.agent):
                child.call_id = child.name  # (its first 100 characters: ``child_id``)
            self._children[event.event_id] = child
            return ChildStarted(child=child.model_copy())
        if kind == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
            started = event.child_workflow_execution_started_event_attributes
            known = self._children.get(started.initiated_event_id)
            if known is not None:
                known.run_id = started.workflow_execution.run_id
            return None
        status = _CLOSED.get(kind)
        if status is None:
            return None
        initiated, payloads, failure = _closing(event)
        ended = self._children.get(initiated)
        if ended is None:
            return None
        child = ended
        child.status = status
        child.closed_at = event_time(event.event_time)
        child.took_ms = ms_between(child.started_at, child.closed_at)
        converter = self._converter(child.workflow_id)
        if payloads is not None and payloads.payloads:
            with contextlib.suppress(ValidationError):
                [result] = await converter.decode(list(payloads.payloads), [_ChildResult])
                child.stop_reason, child.usage = result.stop_reason, result.usage
        if failure is not None and failure.ByteSize():
            child.failure = await failure_of(converter, failure)
        elif kind == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED:
            child.failure = "it did not start: a workflow with its id already exists"
        return ChildEnded(child=child.model_copy())

    def _new(self, workflow_id: str, at: datetime) -> ChildTurn:
        step: int | None = None
        name = workflow_id
        prefix = self._parent_id + "/"
        if workflow_id.startswith(prefix):
            number, _, rest = workflow_id[len(prefix) :].partition("/")
            if number.isdigit() and rest:
                step, name = int(number), rest
        return ChildTurn(
            workflow_id=workflow_id, step=step, name=name, status=TurnStatus.RUNNING, started_at=at
        )

    async def _agent(self, workflow_id: str, payloads: Payloads) -> str | None:
        if not payloads.payloads:
            return None
        try:
            [turn] = await self._converter(workflow_id).decode(
                list(payloads.payloads[:1]), [_ChildInput]
            )
        except ValidationError:
            return None
        return str(turn.agent)

    def _converter(self, workflow_id: str) -> DataConverter:
        """The converter as the parent used it for this child (the context a codec may key
        on)."""
        context = WorkflowSerializationContext(
            namespace=self._client.namespace, workflow_id=workflow_id
        )
        return self._client.data_converter.with_context(context)


def _is_step(name: str, agent: str | None) -> bool:
    """Whether a child's name is a team step's (its agent, or ``<index>-<agent>``) rather
    than the id of a tool call that asked for an agent."""
    index, _, rest = name.partition("-")
    return name == agent or (index.isdigit() and rest == agent)


def _closing(event: HistoryEvent) -> tuple[int, Payloads | None, Failure | None]:
    """A closing event's initiating event, and the result or failure it carries."""
    attributes = event_attributes(event)
    return (
        attributes.initiated_event_id,
        getattr(attributes, "result", None),
        getattr(attributes, "failure", None),
    )


async def read_children(
    client: Client, workflow_id: str, events: Iterable[HistoryEvent]
) -> list[ChildTurn]:
    """The child turns one run of turn ``workflow_id`` started, in the order it started them."""
    tracker = ChildTracker(client, workflow_id)
    for event in events:
        await tracker.see(event)
    return tracker.children


class ChildFollower:
    """Follows a running turn's history (long-polling it, as the server offers: no query, no
    worker), emitting each child turn as it starts and ends, in history order, and the live
    text of each child while it runs (when its worker streams it)."""

    def __init__(
        self, client: Client, handle: WorkflowHandle[Any, Any], emit: Callable[[TurnEvent], None]
    ) -> None:
        self._client = client
        self._handle = handle
        self._emit = emit
        self._seen = 0  # the id of the last event read of the run being read
        self._done = False
        self._progress = asyncio.Condition()
        self._live: dict[str, asyncio.Task[None]] = {}  # child id -> its live-text follower

    async def run(self) -> None:
        """Until the turn's last run closes (or this is cancelled). Any failure only ends the
        following (debug log): the turn's messages are the truth."""
        try:
            await self._follow()
        except Exception as err:
            log.debug("cannot follow the turn's child turns: %s", repr(err)[:200])
        finally:
            for task in self._live.values():
                task.cancel()
            async with self._progress:
                self._done = True
                self._progress.notify_all()

    async def caught_up(self) -> None:
        """Return once this has read the turn's history as far as it is now (or has given
        up, or ``CATCH_UP_SECONDS`` have passed)."""
        with contextlib.suppress(Exception):
            length = (await self._handle.describe()).history_length
            async with asyncio.timeout(CATCH_UP_SECONDS), self._progress:
                await self._progress.wait_for(lambda: self._done or self._seen >= length)

    async def _follow(self) -> None:
        run_id = self._handle.run_id
        while True:
            handle = self._client.get_workflow_handle(self._handle.id, run_id=run_id)
            tracker = ChildTracker(self._client, self._handle.id)
            last: HistoryEvent | None = None
            self._seen = 0
            async for event in handle.fetch_history_events(wait_new_event=True):
                last = event
                if (news := await tracker.see(event)) is not None:
                    self._news(news)
                async with self._progress:
                    self._seen = event.event_id
                    self._progress.notify_all()
            if last is None or (
                last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
            ):
                return
            attributes = last.workflow_execution_continued_as_new_event_attributes
            run_id = attributes.new_execution_run_id

    def _news(self, news: ChildEvent) -> None:
        if isinstance(news, ChildStarted):
            child = news.child
            self._live[child.workflow_id] = asyncio.ensure_future(self._follow_live(child))
        elif isinstance(news, ChildEnded):
            # Cancelled before the end is told, so none of its text follows the end.
            task = self._live.pop(news.child.workflow_id, None)
            if task is not None:
                task.cancel()
        self._emit(news)

    async def _follow_live(self, child: ChildTurn) -> None:
        def text(event: StreamEvent) -> None:
            if isinstance(event, TextDelta):
                self._emit(
                    ChildText(workflow_id=child.workflow_id, agent=child.agent, text=event.text)
                )

        handle = self._client.get_workflow_handle(child.workflow_id)
        await follow_live(self._client, handle, text)


async def with_children(
    client: Client, handle: WorkflowHandle[Any, Any], events: AsyncIterator[StreamEvent]
) -> AsyncIterator[TurnEvent]:
    """``events`` (a turn's stream), with its child turns' starts, ends and live text in
    between. A message waits until the turn's history has been read as far as it (at most
    ``CATCH_UP_SECONDS``), so the steps that led to it come first; and a child that answers a
    tool call waits for the message with the call, which the turn's history records in the
    same workflow task as the child's start."""
    queue: asyncio.Queue[TurnEvent | BaseException | None] = asyncio.Queue()
    follower = ChildFollower(client, handle, queue.put_nowait)

    async def pump() -> None:
        try:
            async with contextlib.aclosing(events):  # type: ignore[type-var]  # a generator
                async for event in events:
                    if isinstance(event, MessageEvent):
                        await follower.caught_up()
                    queue.put_nowait(event)
            await follower.caught_up()
        except BaseException as err:  # handed to the consumer, who raises it
            queue.put_nowait(err)
            return
        queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(follower.run())]
    calls = _CallOrder()
    try:
        while (event := await queue.get()) is not None:
            if isinstance(event, BaseException):
                raise event
            for ready in calls.order(event):
                yield ready
        for ready in calls.rest():
            yield ready
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=5)


class _CallOrder:
    """Holds back the events of a child that answers a tool call until the message with the
    call has come."""

    def __init__(self) -> None:
        self._calls: set[str] = set()  # the tool calls seen, as a child's id holds them
        self._waiting: dict[str, str] = {}  # child id -> the call it waits for
        self._held: list[TurnEvent] = []

    def order(self, event: TurnEvent) -> list[TurnEvent]:
        if isinstance(event, MessageEvent):
            self._calls.update(c[:CALL_ID_CHARS] for c in event.message.tool_calls or {})
            self._waiting = {k: c for k, c in self._waiting.items() if c not in self._calls}
            ready: list[TurnEvent] = [event]
            ready += [e for e in self._held if _child_of(e) not in self._waiting]
            self._held = [e for e in self._held if _child_of(e) in self._waiting]
            return ready
        if isinstance(event, ChildStarted):
            call = event.child.call_id
            if call is not None and call not in self._calls:
                self._waiting[event.child.workflow_id] = call
        if _child_of(event) in self._waiting:
            self._held.append(event)
            return []
        return [event]

    def rest(self) -> list[TurnEvent]:
        held, self._held = self._held, []
        return held


def _child_of(event: TurnEvent) -> str | None:
    if isinstance(event, ChildStarted | ChildEnded):
        return event.child.workflow_id
    return event.workflow_id if isinstance(event, ChildText) else None
