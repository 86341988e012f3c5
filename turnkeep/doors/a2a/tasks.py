"""A task is a session: its id names the session (``session_id_for``), so any gateway finds it
with no task store; a task is found by asking for its session, and read as that session stands
(its ended turns' messages, and a state: working, waiting for input, or how its last turn
ended)."""

from __future__ import annotations

import re

from a2a.types.a2a_pb2 import Artifact, Message, Part, Task, TaskState, TaskStatus
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.sessions import SessionHandle, get_session
from turnkeep.client.turns import get_turn
from turnkeep.doors.a2a.follow import turn_end, waiting_calls
from turnkeep.doors.a2a.messages import (
    agent_message,
    answer_artifact,
    approval_message,
    to_a2a,
    to_history,
)
from turnkeep.workflows.messages import Message as TurnMessage
from turnkeep.workflows.session_io import SESSION_WORKFLOW_NAME

# A task id (and context id) as a client may name it: it becomes part of a workflow id.
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def session_id_for(agent: str, task_id: str) -> str:
    """The session a task of ``agent`` is: deterministic, so any gateway finds it. The task id
    holds no ``:``, so two agents' tasks never share a session id."""
    return f"a2a:{agent}:{task_id}"


def checked_task_id(value: str, what: str = "task id") -> str:
    """``value`` if it may name a task; else ``InvalidParamsError`` saying what may."""
    if not TASK_ID.fullmatch(value):
        raise InvalidParamsError(
            message=f"invalid {what}: 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


async def existing_session(client: Client, agent: str, task_id: str) -> tuple[SessionHandle, bool]:
    """The session task ``task_id`` is, and whether it runs; ``TaskNotFoundError`` if none."""
    session = get_session(client, session_id_for(agent, checked_task_id(task_id)))
    try:
        described = await session.handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise TaskNotFoundError(message=f"no task {task_id!r}") from None
        raise
    if described.workflow_type != SESSION_WORKFLOW_NAME:
        raise TaskNotFoundError(message=f"no task {task_id!r}")
    return session, described.status == WorkflowExecutionStatus.RUNNING


async def session_transcript(session: SessionHandle) -> list[TurnMessage]:
    """The messages of the session's ended turns."""
    return [m async for m in session.transcript()]


async def snapshot(client: Client, task_id: str, session: SessionHandle, running: bool) -> Task:
    """The task as its session stands: every ended turn's messages, and its state."""
    message: Message | None = None
    artifacts: list[Artifact] = []
    if not running:
        closed = await session.result()
        transcript = closed.transcript
        state: TaskState = TaskState.TASK_STATE_COMPLETED
    else:
        progress = await session.progress()
        transcript = await session_transcript(session)
        if progress.turn is not None:
            waiting = await waiting_calls(get_turn(client, progress.turn.workflow_id))
            state = TaskState.TASK_STATE_INPUT_REQUIRED if waiting else TaskState.TASK_STATE_WORKING
            if waiting:
                message = approval_message(task_id, waiting)
        elif progress.turns_ended == 0:
            state = TaskState.TASK_STATE_SUBMITTED
        else:
            last = f"{session.session_id}/turn-{progress.turns_ended}"
            state, text = await turn_end(get_turn(client, last))
            if state != TaskState.TASK_STATE_COMPLETED:
                message = agent_message(task_id, f"{last}/end", [Part(text=text)])
    history = to_history(task_id, transcript)
    if state == TaskState.TASK_STATE_COMPLETED and transcript:
        final = transcript[-1]
        if final.role == "assistant" and final.text:
            message = to_a2a(final, task_id, f"{task_id}/{len(transcript) - 1}")
            artifacts.append(answer_artifact("last", final.text))
    status = TaskStatus(state=state)
    if message is not None:
        status.message.CopyFrom(message)
    return Task(id=task_id, context_id=task_id, status=status, history=history, artifacts=artifacts)
