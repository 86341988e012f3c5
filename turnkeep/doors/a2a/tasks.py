"""A context is a session and a task is one of its turns (A2A 1.0's "a task is one exchange,
the context is the conversation"): a context id names the session (``session_id_for``), a task
id names the context and the turn (``task_id_for``), so any gateway finds either with no task
store. A task is read as its turn stands: the turn's own messages, and a state (submitted while
queued, working, waiting for input, or how the turn ended)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from a2a.types.a2a_pb2 import Artifact, Message, Part, Task, TaskState, TaskStatus
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.sessions import SessionHandle, get_session
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.messages import Message as TurnMessage
from turnkeep.doors.a2a.follow import task_status, turn_end, waited_since, waiting_calls
from turnkeep.doors.a2a.messages import (
    agent_message,
    answer_artifact,
    approval_message,
    to_a2a,
    to_history,
)

# A context id as a client may name it: it becomes part of a workflow id.
CONTEXT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A task id: its context id, then the turn's number (``~`` is in no context id).
_TASK_ID = re.compile(r"(?P<context>[A-Za-z0-9][A-Za-z0-9._-]{0,99})~(?P<turn>[1-9][0-9]{0,8})")
TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)


def session_id_for(agent: str, context_id: str) -> str:
    """The session a context of ``agent`` is: deterministic, so any gateway finds it. The
    context id holds no ``:``, so two agents' contexts never share a session id."""
    return f"a2a:{agent}:{context_id}"


def task_id_for(context_id: str, turn: int) -> str:
    """The task that turn ``turn`` of the context's session is."""
    return f"{context_id}~{turn}"


class TaskRef(BaseModel):
    """Where a task lives: its context (the session) and its turn."""

    task_id: str
    context_id: str
    turn: int

    def session_id(self, agent: str) -> str:
        return session_id_for(agent, self.context_id)

    def turn_id(self, agent: str) -> str:
        return f"{self.session_id(agent)}/turn-{self.turn}"


def task_ref(task_id: str) -> TaskRef:
    """The context and turn ``task_id`` names; ``TaskNotFoundError`` if it names none (task
    ids are the server's to give)."""
    match = _TASK_ID.fullmatch(task_id)
    if match is None:
        raise TaskNotFoundError(message=f"no task {_shown(task_id)}")
    return TaskRef(task_id=task_id, context_id=match["context"], turn=int(match["turn"]))


def checked_context_id(value: str) -> str:
    """``value`` if it may name a context; else ``InvalidParamsError`` saying what may."""
    if not CONTEXT_ID.fullmatch(value):
        raise InvalidParamsError(
            message="invalid context id: 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


async def existing_session(
    client: Client, agent: str, context_id: str
) -> tuple[SessionHandle, bool] | None:
    """The session context ``context_id`` is, and whether it runs; None if there is none."""
    session = get_session(client, session_id_for(agent, context_id))
    described = await session.described()
    if described is None:
        return None
    return session, described.status == WorkflowExecutionStatus.RUNNING


async def snapshot(client: Client, agent: str, ref: TaskRef) -> Task:
    """The task as its turn stands: the turn's messages, its state, and (once it has
    completed) its answer as the status message and the ``answer`` artifact."""
    turn = get_turn(client, ref.turn_id(agent))
    try:
        described = await turn.handle.describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return await _queued(client, agent, ref)
    if described.status == WorkflowExecutionStatus.RUNNING:
        return await _running(ref, turn, described.start_time)
    return await _ended(ref, turn)


async def _queued(client: Client, agent: str, ref: TaskRef) -> Task:
    """A turn not started yet: submitted if its session will run it, else no such task."""
    found = await existing_session(client, agent, ref.context_id)
    if found is None or not found[1]:
        raise TaskNotFoundError(message=f"no task {_shown(ref.task_id)}")
    progress = await found[0].progress()
    started = progress.turns_ended + (1 if progress.turn is not None else 0)
    if progress.closed or ref.turn <= started:
        raise TaskNotFoundError(message=f"no task {_shown(ref.task_id)}")
    return _task(ref, task_status(TaskState.TASK_STATE_SUBMITTED))


async def _running(ref: TaskRef, turn: TurnHandle, started: datetime) -> Task:
    current = await turn.current()
    waiting = await waiting_calls(turn)
    if waiting:
        message = approval_message(ref.task_id, ref.context_id, waiting)
        status = task_status(TaskState.TASK_STATE_INPUT_REQUIRED, message, at=waited_since(waiting))
    else:
        status = task_status(TaskState.TASK_STATE_WORKING, at=started)
    return _task(ref, status, history=current.messages if current else [])


async def _ended(ref: TaskRef, turn: TurnHandle) -> Task:
    state, text, at = await turn_end(turn)
    current = await turn.current()
    messages = current.messages if current else []
    final = current.final if current else None
    artifacts: list[Artifact] = []
    message: Message | None
    if state == TaskState.TASK_STATE_COMPLETED and final is not None and final.text:
        message = to_a2a(final, ref.task_id, ref.context_id, f"{ref.task_id}/answer")
        artifacts.append(answer_artifact(str(ref.turn), final.text))
    else:
        message = agent_message(
            ref.task_id, ref.context_id, f"{ref.task_id}/end", [Part(text=text)]
        )
    return _task(ref, task_status(state, message, at=at), history=messages, artifacts=artifacts)


def _task(
    ref: TaskRef,
    status: TaskStatus,
    *,
    history: Sequence[TurnMessage] = (),
    artifacts: list[Artifact] | None = None,
) -> Task:
    return Task(
        id=ref.task_id,
        context_id=ref.context_id,
        status=status,
        history=to_history(ref.task_id, ref.context_id, history),
        artifacts=artifacts or [],
    )


def _shown(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:59] + "…")
