"""A2A's requests for one agent, answered from and by its sessions: a message goes to the task it
names (or a new one), and is sent as a turn or decides the calls waiting in the running one; the
answer follows that turn. Errors other than A2A's reach the client as one line, logged here.

There is no task store: the SDK's ``DefaultRequestHandler`` keeps each task's state in a
``TaskStore`` and its running executions in memory, a second copy of what the session holds.
``SessionRequestHandler`` answers every request from the session itself, so a gateway that
restarts loses nothing: a task id names its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types.a2a_pb2 import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    A2AError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length
from temporalio.client import Client, WorkflowUpdateFailedError

from turnkeep.client.sessions import SessionClosedError, SessionHandle, open_session
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.doors.a2a.callers import caller_of
from turnkeep.doors.a2a.follow import Follow, follow_turn, waiting_calls
from turnkeep.doors.a2a.messages import Incoming, read_message, text_decisions, to_history
from turnkeep.doors.a2a.tasks import (
    checked_task_id,
    existing_session,
    session_id_for,
    session_transcript,
    snapshot,
)
from turnkeep.workflows.approval import PendingCall
from turnkeep.workflows.session_io import NewMessageMode
from turnkeep.workflows.turn_workflow import TurnWorkflow

log = logging.getLogger(__name__)

# How long tasks/cancel waits for the cancelled turn to end (its repair) before answering.
CANCEL_WAIT_SECONDS = 10.0

P = ParamSpec("P")
R = TypeVar("R")


def _guarded(method: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """A2A errors pass; anything else becomes one line without its detail (which the SDK would
    otherwise send the client as is), logged by type."""

    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except A2AError:
            raise
        except Exception as err:
            raise _internal(method.__name__, err) from err

    wrapper.__name__ = method.__name__
    return wrapper


def _internal(where: str, err: Exception) -> InternalError:
    log.warning("a2a %s failed: %s", where, type(err).__name__)
    log.debug("a2a %s failure", where, exc_info=True)
    return InternalError(message="the server could not do this; its log says why")


class SessionRequestHandler(RequestHandler):
    """A2A's requests for one agent, answered from and by its sessions (no task store)."""

    def __init__(
        self,
        client: Client,
        agent: str,
        *,
        task_queue: str,
        on_new_message: NewMessageMode = "queue",
        card: AgentCard,
    ) -> None:
        self.client = client
        self.agent = agent
        self.task_queue = task_queue
        self.on_new_message: NewMessageMode = on_new_message
        self.card = card

    # -- sessions

    async def _for_message(self, message: Message, incoming: Incoming) -> tuple[str, SessionHandle]:
        """The task a message goes to: the one it names (which must exist), else the one its
        context id names, else a new one, started only for a message it can take."""
        task_id, context_id = message.task_id, message.context_id
        if task_id and context_id and task_id != context_id:
            raise InvalidParamsError(
                message="contextId must be the taskId: a task is one conversation"
            )
        key = task_id or (checked_task_id(context_id, "context id") if context_id else "")
        if key:
            try:
                session, running = await existing_session(self.client, self.agent, key)
            except TaskNotFoundError:
                if task_id:  # task ids are the server's to give
                    raise
            else:
                if not running:
                    raise InvalidParamsError(
                        message=f"task {key!r} has ended: it takes no more messages"
                    )
                return key, session
        key = key or _new_id()
        if incoming.decisions:
            raise InvalidParamsError(message=f"no call of task {key!r} waits for a decision")
        if not incoming.text.strip():
            raise InvalidParamsError(message="the message has no text")
        try:
            session = await open_session(
                self.client,
                agent=self.agent,
                session_id=session_id_for(self.agent, key),
                task_queue=self.task_queue,
                on_new_message=self.on_new_message,
            )
        except SessionClosedError:
            raise InvalidParamsError(
                message=f"task {key!r} has ended: it takes no more messages"
            ) from None
        return key, session

    # -- one message: a turn, or decisions

    async def _begin(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> tuple[str, SessionHandle, Follow]:
        """Validate the message, then send it as a turn or decide the calls it answers; what
        to follow next."""
        incoming = read_message(params.message)
        task_id, session = await self._for_message(params.message, incoming)
        progress = await session.progress()
        running = progress.turn
        waiting: list[PendingCall] = []
        if running is not None:
            waiting = await waiting_calls(get_turn(self.client, running.workflow_id))
        if waiting and running is not None:
            if not caller_of(context).decide:
                raise InvalidRequestError(message="this caller may not decide calls")
            decisions = incoming.decisions or text_decisions(incoming.text, waiting)
            turn = get_turn(self.client, running.workflow_id)
            # Counted before deciding: what the decision sets off is followed, however fast.
            done = (await turn.handle.query(TurnWorkflow.progress)).count
            for decision in decisions:
                try:
                    await turn.decide(
                        decision.call_id,
                        decision.approve,
                        decision.reason,
                        by=f"{caller_of(context).name} via a2a",
                        arguments=decision.arguments,
                    )
                except WorkflowUpdateFailedError as err:
                    raise InvalidParamsError(message=f"not decided: {_cause(err)}") from None
            return (
                task_id,
                session,
                Follow(
                    start=running.start + done,
                    turn=_turn_number(running.workflow_id),
                    turn_id=running.workflow_id,
                    ask_first=True,
                ),
            )
        if incoming.decisions:
            raise InvalidParamsError(message=f"no call of task {task_id!r} waits for a decision")
        if not incoming.text.strip():
            raise InvalidParamsError(message="the message has no text")
        try:
            sent = await session.send(incoming.text)
        except WorkflowUpdateFailedError as err:
            raise InvalidParamsError(message=f"not sent: {_cause(err)}") from None
        except SessionClosedError:
            raise InvalidParamsError(
                message=f"task {task_id!r} has ended: it takes no more messages"
            ) from None
        return (
            task_id,
            session,
            Follow(start=progress.count, turn=sent.turn, turn_id=sent.turn_id, ask_first=False),
        )

    # -- RequestHandler

    @_guarded
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task:
        task_id, session, follow = await self._begin(params, context)
        final: TaskStatusUpdateEvent | None = None
        artifacts: list[Artifact] = []
        if not params.configuration.return_immediately:
            async for event in follow_turn(self.client, session, task_id, follow, live=False):
                if isinstance(event, TaskStatusUpdateEvent):
                    final = event
                elif event.artifact.name == "answer":
                    artifacts.append(event.artifact)
        if final is None:  # return_immediately: the task as it stands
            task = await snapshot(self.client, task_id, session, running=True)
        else:
            config = params.configuration
            unwanted = config.HasField("history_length") and config.history_length == 0
            history = [] if unwanted else to_history(task_id, await session_transcript(session))
            task = Task(
                id=task_id,
                context_id=task_id,
                status=final.status,
                history=history,
                artifacts=artifacts,
            )
        return apply_history_length(task, params.configuration)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent, None]:
        try:
            task_id, session, follow = await self._begin(params, context)
            first = Task(
                id=task_id,
                context_id=task_id,
                status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
            )
            first.history.append(params.message)
            first.history[0].task_id = task_id
            first.history[0].context_id = task_id
            yield first
            async for event in follow_turn(self.client, session, task_id, follow, live=True):
                yield event
        except A2AError:
            raise
        except Exception as err:
            raise _internal("on_message_send_stream", err) from err

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent, None]:
        try:
            session, running = await existing_session(self.client, self.agent, params.id)
            progress = await session.progress() if running else None
            if progress is None or progress.turn is None:
                raise UnsupportedOperationError(message=f"task {params.id!r} has no turn running")
            yield await snapshot(self.client, params.id, session, running=True)
            turn = progress.turn
            done = (
                await get_turn(self.client, turn.workflow_id).handle.query(TurnWorkflow.progress)
            ).count
            follow = Follow(
                start=turn.start + done,
                turn=_turn_number(turn.workflow_id),
                turn_id=turn.workflow_id,
                ask_first=True,
            )
            async for event in follow_turn(self.client, session, params.id, follow, live=True):
                yield event
        except A2AError:
            raise
        except Exception as err:
            raise _internal("on_subscribe_to_task", err) from err

    @_guarded
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        session, running = await existing_session(self.client, self.agent, params.id)
        return apply_history_length(
            await snapshot(self.client, params.id, session, running), params
        )

    @_guarded
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        session, running = await existing_session(self.client, self.agent, params.id)
        progress = await session.progress() if running else None
        if progress is None or progress.turn is None:
            raise TaskNotCancelableError(message=f"task {params.id!r} has no turn running")
        turn = get_turn(self.client, progress.turn.workflow_id)
        await turn.cancel()
        # Its repair is quick; the answer then says how the turn ended.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_ended(turn), CANCEL_WAIT_SECONDS)
        task = await snapshot(self.client, params.id, session, running=True)
        if task.status.state == TaskState.TASK_STATE_WORKING:
            # The cancellation is asked for; the turn has not ended yet.
            task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_CANCELED))
        return task

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        raise UnsupportedOperationError(
            message="tasks are not listed here: `turnkeep sessions` lists them"
        )

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise UnsupportedOperationError(message="there is no extended agent card")


async def _ended(turn: TurnHandle) -> None:
    with contextlib.suppress(Exception):
        await turn.handle.result()


def _turn_number(turn_id: str) -> int:
    """The number in a session turn's id, ``<session id>/turn-<n>``."""
    return int(turn_id.rsplit("/turn-", 1)[1])


def _cause(err: WorkflowUpdateFailedError) -> str:
    cause = err.cause
    return str(getattr(cause, "message", None) or cause or err).splitlines()[0]


def _new_id() -> str:
    return uuid.uuid4().hex
