"""A running turn followed as A2A events: its live text as artifact updates, its messages as
status updates, until it ends (a final status, with the answer as an artifact) or a call of the
session's running turn waits for a decision (``input-required``). A waiting call shows in no
message, so the turn is asked for it; and an ended turn is asked how it ended."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from turnkeep.client.live import MessageEvent, Restarted, StreamEvent, TextDelta, ToolCallStart
from turnkeep.client.sessions import SessionHandle
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.approval import PendingCall
from turnkeep.contract.messages import Message as TurnMessage
from turnkeep.doors.a2a.messages import agent_message, answer_artifact, approval_message, to_a2a

# How often a follower asks the turn for calls waiting for approval while the model's tool
# calls have no results yet (a waiting call shows in no message: the turn is asked): soon
# after the calls start, then less and less often while the tools run.
APPROVAL_POLL_SECONDS = 0.2
MAX_APPROVAL_POLL_SECONDS = 2.0

_FINAL_STATES = {
    WorkflowExecutionStatus.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    WorkflowExecutionStatus.CANCELED: TaskState.TASK_STATE_CANCELED,
}


class Follow(BaseModel):
    """Where to follow a turn from: the transcript index, the turn's number and id, whether a
    call may already wait for a decision (a turn already running), and whether the turn is
    queued behind the session's running one (``start`` is then where that one starts)."""

    start: int
    turn: int
    turn_id: str
    ask_first: bool
    queued: bool = False


async def _as_events(messages: AsyncIterator[TurnMessage]) -> AsyncIterator[StreamEvent]:
    async for message in messages:
        yield MessageEvent(message=message)


async def follow_turn(
    client: Client,
    session: SessionHandle,
    task_id: str,
    context_id: str,
    follow: Follow,
    *,
    live: bool,
    through_input: bool = False,
) -> AsyncIterator[TaskStatusUpdateEvent | TaskArtifactUpdateEvent]:
    """The turn's events until it ends (a final status) or a call waits (input-required);
    ``through_input``: on past a wait, to the end (a subscriber's stream ends only there)."""
    turn = get_turn(client, follow.turn_id)
    start = follow.start
    if follow.queued:
        # A task is its own turn: the turns before it are passed over, not shown as its own.
        async for _message in session.messages(start, until_turn=follow.turn - 1):
            start += 1
    stream: AsyncIterator[StreamEvent] = (
        session.stream(start, until_turn=follow.turn)
        if live
        else _as_events(session.messages(start, until_turn=follow.turn))
    )
    answer: str | None = None
    index = start
    artifacts: set[str] = set()
    ask = follow.ask_first  # whether a call may be waiting for a decision now
    reported: set[str] = set()  # the calls whose wait was said (following through input)
    pause = 0.0 if follow.ask_first else APPROVAL_POLL_SECONDS  # before asking again
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        next_event: asyncio.Task[StreamEvent] | None = None
        try:
            while True:
                if next_event is None:
                    next_event = asyncio.ensure_future(anext(stream))
                done, _ = await asyncio.wait({next_event}, timeout=pause if ask else None)
                if not done:
                    pause = min(max(pause * 2, APPROVAL_POLL_SECONDS), MAX_APPROVAL_POLL_SECONDS)
                    # The session's running turn: a message queued behind a turn whose
                    # call waits is answered only once that call is decided.
                    waiting = await _waiting_in(client, session)
                    if waiting and {c.call_id for c in waiting} != reported:
                        yield _status(
                            task_id,
                            context_id,
                            TaskState.TASK_STATE_INPUT_REQUIRED,
                            approval_message(task_id, context_id, waiting),
                            at=waited_since(waiting),
                        )
                        if not through_input:
                            return
                        reported = {c.call_id for c in waiting}
                    if waiting:
                        ask = False  # until the turn goes on: its next message says so
                    continue
                try:
                    event = next_event.result()
                except StopAsyncIteration:
                    break
                next_event = None
                pause = APPROVAL_POLL_SECONDS
                if isinstance(event, TextDelta):
                    artifact = f"text-{follow.turn}-{event.call_index}"
                    yield TaskArtifactUpdateEvent(
                        task_id=task_id,
                        context_id=context_id,
                        artifact=Artifact(
                            artifact_id=artifact,
                            name="live text",
                            parts=[Part(text=event.text)],
                        ),
                        append=artifact in artifacts,
                    )
                    artifacts.add(artifact)
                elif isinstance(event, Restarted):
                    # A retried model call's text starts over: the artifact is replaced.
                    artifact = f"text-{follow.turn}-{event.call_index}"
                    artifacts.discard(artifact)
                elif isinstance(event, ToolCallStart):
                    ask = True
                elif isinstance(event, MessageEvent):
                    message = event.message
                    # Numbered within the turn, as its task's history numbers them.
                    converted = to_a2a(message, task_id, context_id, f"{task_id}/{index - start}")
                    index += 1
                    if message.role == "assistant":
                        ask = bool(message.tool_calls)
                        if message.text:
                            answer = message.text
                    elif message.tool_results:
                        ask = False
                    else:
                        continue  # the user's own message
                    if converted is not None:
                        yield _status(task_id, context_id, TaskState.TASK_STATE_WORKING, converted)
        finally:
            if next_event is not None and not next_event.done():
                next_event.cancel()
                with contextlib.suppress(BaseException):
                    await next_event
    state, text, at = await turn_end(turn)
    if state == TaskState.TASK_STATE_COMPLETED and answer is not None:
        yield TaskArtifactUpdateEvent(
            task_id=task_id,
            context_id=context_id,
            artifact=answer_artifact(str(follow.turn), answer),
            last_chunk=True,
        )
        text = answer
    ending = "answer" if state == TaskState.TASK_STATE_COMPLETED and answer else "end"
    final = agent_message(task_id, context_id, f"{task_id}/{ending}", [Part(text=text)])
    yield _status(task_id, context_id, state, final, at=at)


async def _waiting_in(client: Client, session: SessionHandle) -> list[PendingCall]:
    """The calls of the session's running turn that wait for a decision."""
    running = (await session.progress()).turn
    return [] if running is None else await waiting_calls(get_turn(client, running.workflow_id))


async def waiting_calls(turn: TurnHandle) -> list[PendingCall]:
    """The turn's calls waiting for a decision; none once it has ended (or not started)."""
    try:
        return await turn.pending_approvals()
    except RPCError:
        return []


class TurnEnd(NamedTuple):
    """How an ended turn ended: a task state, one line, and when (its workflow's close)."""

    state: TaskState
    text: str
    at: datetime | None


def waited_since(calls: Sequence[PendingCall]) -> datetime:
    """When the task began to wait for input: its latest waiting call's start (the same for
    every reader, so two subscribers see the same status)."""
    return max(call.since for call in calls)


async def turn_end(turn: TurnHandle) -> TurnEnd:
    """How an ended turn ended."""
    try:
        described = await turn.handle.describe()
    except RPCError:
        return TurnEnd(TaskState.TASK_STATE_COMPLETED, "the turn has ended", None)
    status, at = described.status, described.close_time
    state = (
        _FINAL_STATES.get(status, TaskState.TASK_STATE_FAILED)
        if status
        else TaskState.TASK_STATE_FAILED
    )
    name = status.name.lower() if status else "unknown"
    if state == TaskState.TASK_STATE_CANCELED:
        text = (
            "the turn was cancelled: its conversation is repaired, and the context takes new "
            "messages"
        )
        return TurnEnd(state, text, at)
    if state == TaskState.TASK_STATE_FAILED:
        text = f"the turn ended {name}: `turnkeep show {turn.workflow_id}` says why"
        return TurnEnd(state, text, at)
    return TurnEnd(state, "the turn has ended", at)


def task_status(
    state: TaskState, message: Message | None = None, *, at: datetime | None = None
) -> TaskStatus:
    """A task's status: stamped with when it began (``at``) when that is known, so every
    reader sees the same; else now."""
    status = TaskStatus(state=state)
    if message is not None:
        status.message.CopyFrom(message)
    if at is None:
        status.timestamp.GetCurrentTime()
    else:
        status.timestamp.FromDatetime(at.astimezone(UTC).replace(tzinfo=None))
    return status


def _status(
    task_id: str,
    context_id: str,
    state: TaskState,
    message: Message | None = None,
    *,
    at: datetime | None = None,
) -> TaskStatusUpdateEvent:
    return TaskStatusUpdateEvent(
        task_id=task_id, context_id=context_id, status=task_status(state, message, at=at)
    )
