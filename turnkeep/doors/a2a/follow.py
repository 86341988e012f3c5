"""A running turn followed as A2A events: its live text as artifact updates, its messages as
status updates, until it ends (a final status, with the answer as an artifact) or a call of the
session's running turn waits for a decision (``input-required``). A waiting call shows in no
message, so the turn is asked for it; and an ended turn is asked how it ended."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

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
from turnkeep.doors.a2a.messages import agent_message, answer_artifact, approval_message, to_a2a
from turnkeep.workflows.approval import PendingCall
from turnkeep.workflows.messages import Message as TurnMessage

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
    """Where to follow a turn from: the transcript index, the turn's number and id, and
    whether a call may already wait for a decision (a turn already running)."""

    start: int
    turn: int
    turn_id: str
    ask_first: bool


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
) -> AsyncIterator[TaskStatusUpdateEvent | TaskArtifactUpdateEvent]:
    """The turn's events until it ends (a final status) or a call waits (input-required)."""
    turn = get_turn(client, follow.turn_id)
    stream: AsyncIterator[StreamEvent] = (
        session.stream(follow.start, until_turn=follow.turn)
        if live
        else _as_events(session.messages(follow.start, until_turn=follow.turn))
    )
    answer: str | None = None
    index = follow.start
    artifacts: set[str] = set()
    ask = follow.ask_first  # whether a call may be waiting for a decision now
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
                    if waiting:
                        yield _status(
                            task_id,
                            context_id,
                            TaskState.TASK_STATE_INPUT_REQUIRED,
                            approval_message(task_id, context_id, waiting),
                        )
                        return
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
                    converted = to_a2a(message, task_id, context_id, f"{task_id}/{index}")
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
    state, text = await turn_end(turn)
    if state == TaskState.TASK_STATE_COMPLETED and answer is not None:
        yield TaskArtifactUpdateEvent(
            task_id=task_id,
            context_id=context_id,
            artifact=answer_artifact(str(follow.turn), answer),
            last_chunk=True,
        )
        text = answer
    final = agent_message(task_id, context_id, f"{task_id}/end", [Part(text=text)])
    yield _status(task_id, context_id, state, final)


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


async def turn_end(turn: TurnHandle) -> tuple[TaskState, str]:
    """How an ended turn ended, as a task state and one line."""
    try:
        status = (await turn.handle.describe()).status
    except RPCError:
        return TaskState.TASK_STATE_COMPLETED, "the turn has ended"
    state = (
        _FINAL_STATES.get(status, TaskState.TASK_STATE_FAILED)
        if status
        else TaskState.TASK_STATE_FAILED
    )
    name = status.name.lower() if status else "unknown"
    if state == TaskState.TASK_STATE_CANCELED:
        return (
            state,
            "the turn was cancelled: its conversation is repaired, and the context takes new "
            "messages",
        )
    if state == TaskState.TASK_STATE_FAILED:
        return state, f"the turn ended {name}: `turnkeep show {turn.workflow_id}` says why"
    return state, "the turn has ended"


def _status(
    task_id: str, context_id: str, state: TaskState, message: Message | None = None
) -> TaskStatusUpdateEvent:
    status = TaskStatus(state=state)
    if message is not None:
        status.message.CopyFrom(message)
    status.timestamp.GetCurrentTime()
    return TaskStatusUpdateEvent(task_id=task_id, context_id=context_id, status=status)
