"""A2A's requests for one agent, answered from and by its sessions: a message without a task is
the next turn of its context's session (a new task); a message naming a task answers the calls
that task waits on, and a task that has ended takes none. The answer follows that turn. Errors
other than A2A's reach the client as one line, logged here.

There is no task store: the SDK's ``DefaultRequestHandler`` keeps each task's state in a
``TaskStore`` and its running executions in memory, a second copy of what the session holds.
``SessionRequestHandler`` answers every request from the session itself, so a gateway that
restarts loses nothing: a task id names its session and turn, and ``ListTasks`` asks Temporal's
visibility.
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
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
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
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length
from temporalio.client import Client, WorkflowUpdateFailedError

from turnkeep.client.sessions import SessionClosedError, SessionHandle, get_session, open_session
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.session_io import NewMessageMode
from turnkeep.doors.a2a.callers import caller_of
from turnkeep.doors.a2a.follow import Follow, follow_turn, waiting_calls
from turnkeep.doors.a2a.listing import list_tasks
from turnkeep.doors.a2a.messages import (
    Incoming,
    read_message,
    text_answer_field,
    text_decisions,
    user_message,
)
from turnkeep.doors.a2a.tasks import (
    TERMINAL,
    TaskRef,
    checked_context_id,
    existing_session,
    session_id_for,
    snapshot,
    task_id_for,
    task_ref,
)
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

    # -- one message: a new task (a turn), or the answer a waiting task asks for

    async def _begin(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> tuple[TaskRef, SessionHandle, Follow]:
        """Validate the message, then decide the calls of the task it names, or send it as
        the next turn of its context; what to follow next."""
        message = params.message
        incoming = read_message(message)
        if message.task_id:
            ref = task_ref(message.task_id)
            if message.context_id and message.context_id != ref.context_id:
                raise InvalidParamsError(
                    message=f"task {message.task_id!r} is in context {ref.context_id!r}, "
                    f"not {message.context_id!r}"
                )
            return await self._answer(ref, incoming, context)
        context_id = checked_context_id(message.context_id) if message.context_id else _new_id()
        if incoming.decisions:
            raise InvalidParamsError(
                message="decisions answer a task waiting for input: name it (taskId)"
            )
        if not incoming.text.strip():
            raise InvalidParamsError(message="the message has no text")
        session = await self._session(context_id, context)
        progress = await session.progress()
        if progress.turn is not None:
            waiting = await waiting_calls(get_turn(self.client, progress.turn.workflow_id))
            if waiting:
                # Queued behind a turn that waits, the message would wait as long.
                waiting_task = task_id_for(context_id, _turn_number(progress.turn.workflow_id))
                raise InvalidParamsError(
                    message=f"task {waiting_task!r} of this context waits for input: "
                    "answer it first (its taskId)"
                )
        try:
            sent = await session.send(user_message(incoming.text, message.message_id))
        except WorkflowUpdateFailedError as err:
            raise InvalidParamsError(message=f"not sent: {_cause(err)}") from None
        except SessionClosedError:
            raise _closed_context(context_id) from None
        turn = _turn_number(sent.turn_id)
        ref = TaskRef(task_id=task_id_for(context_id, turn), context_id=context_id, turn=turn)
        return (
            ref,
            session,
            Follow(
                start=progress.count,
                turn=turn,
                turn_id=sent.turn_id,
                ask_first=False,
                # Behind a turn that ran when asked, even if it has ended since.
                queued=sent.queued or progress.turn is not None,
            ),
        )

    async def _session(self, context_id: str, context: ServerCallContext) -> SessionHandle:
        """The session of the context: running, or started for this message at its caller's
        priority and tenant (a running one keeps those it was started with)."""
        found = await existing_session(self.client, self.agent, context_id)
        if found is not None:
            if not found[1]:
                raise _closed_context(context_id)
            return found[0]
        caller = caller_of(context)
        try:
            return await open_session(
                self.client,
                agent=self.agent,
                session_id=session_id_for(self.agent, context_id),
                task_queue=self.task_queue,
                on_new_message=self.on_new_message,
                priority=caller.priority,
                tenant=caller.tenant,
            )
        except SessionClosedError:
            raise _closed_context(context_id) from None

    async def _answer(
        self, ref: TaskRef, incoming: Incoming, context: ServerCallContext
    ) -> tuple[TaskRef, SessionHandle, Follow]:
        """A message to an existing task: it answers the calls that task waits on. A task
        that has ended takes no more messages (A2A's terminal states); one that works needs
        none."""
        task = await snapshot(self.client, self.agent, ref)
        state = task.status.state
        if state in TERMINAL:
            raise UnsupportedOperationError(
                message=f"task {ref.task_id!r} has ended ({_state_name(state)}): it takes no "
                "more messages; send the next one in its context (contextId, no taskId)"
            )
        if state != TaskState.TASK_STATE_INPUT_REQUIRED:
            raise UnsupportedOperationError(
                message=f"task {ref.task_id!r} is {_state_name(state)}: it takes a message only "
                "when it waits for input"
            )
        if not caller_of(context).decide:
            raise InvalidRequestError(message="this caller may not decide calls")
        turn = get_turn(self.client, ref.turn_id(self.agent))
        waiting = await waiting_calls(turn)
        # A question a tool asked (an elicitation of one string) takes the text as its answer;
        # a call waiting for approval takes a decision.
        questions = {
            c.call_id: field
            for c in waiting
            if not incoming.decisions and (field := text_answer_field(c))
        }
        if questions and not incoming.text.strip():
            raise InvalidParamsError(message="the message has no text to answer with")
        decisions = (
            [] if questions else incoming.decisions or text_decisions(incoming.text, waiting)
        )
        session = get_session(self.client, ref.session_id(self.agent))
        progress = await session.progress()
        running = progress.turn
        if running is None or running.workflow_id != turn.workflow_id:
            raise UnsupportedOperationError(message=f"task {ref.task_id!r} is not running")
        # Counted before deciding: what the decision sets off is followed, however fast.
        done = (await turn.handle.query(TurnWorkflow.progress)).count
        by = f"{caller_of(context).name} via a2a"
        try:
            for call_id, field in questions.items():
                await turn.answer_elicitation(call_id, {field: incoming.text}, by=by)
            for decision in decisions:
                await turn.decide(
                    decision.call_id,
                    decision.approve,
                    decision.reason,
                    by=by,
                    arguments=decision.arguments,
                )
        except WorkflowUpdateFailedError as err:
            raise InvalidParamsError(message=f"not decided: {_cause(err)}") from None
        return (
            ref,
            session,
            Follow(
                start=running.start + done,
                turn=ref.turn,
                turn_id=turn.workflow_id,
                ask_first=True,
            ),
        )

    # -- RequestHandler

    @_guarded
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task:
        ref, session, follow = await self._begin(params, context)
        if not params.configuration.return_immediately:
            # Until the turn ends or waits for input (A2A's blocking send).
            async for _event in follow_turn(
                self.client, session, ref.task_id, ref.context_id, follow, live=False
            ):
                pass
        task = await snapshot(self.client, self.agent, ref)
        return apply_history_length(task, params.configuration)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent, None]:
        try:
            ref, session, follow = await self._begin(params, context)
            first = Task(
                id=ref.task_id,
                context_id=ref.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
            )
            first.status.timestamp.GetCurrentTime()
            first.history.append(params.message)
            first.history[0].task_id = ref.task_id
            first.history[0].context_id = ref.context_id
            yield first
            async for event in follow_turn(
                self.client, session, ref.task_id, ref.context_id, follow, live=True
            ):
                yield event
        except A2AError:
            raise
        except Exception as err:
            raise _internal("on_message_send_stream", err) from err

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent, None]:
        try:
            ref = task_ref(params.id)
            task = await snapshot(self.client, self.agent, ref)
            if task.status.state in TERMINAL:
                raise UnsupportedOperationError(
                    message=f"task {params.id!r} has ended ({_state_name(task.status.state)})"
                )
            session = get_session(self.client, ref.session_id(self.agent))
            progress = await session.progress()
            turn_id = ref.turn_id(self.agent)
            if progress.turn is not None and progress.turn.workflow_id == turn_id:
                done = (
                    await get_turn(self.client, turn_id).handle.query(TurnWorkflow.progress)
                ).count
                follow = Follow(
                    start=progress.turn.start + done,
                    turn=ref.turn,
                    turn_id=turn_id,
                    ask_first=True,
                )
            else:  # queued behind the running turn
                follow = Follow(
                    start=progress.count,
                    turn=ref.turn,
                    turn_id=turn_id,
                    ask_first=True,
                    queued=True,
                )
            yield task
            # A subscriber's stream ends only when the task does (A2A's SubscribeToTask).
            async for event in follow_turn(
                self.client,
                session,
                ref.task_id,
                ref.context_id,
                follow,
                live=True,
                through_input=True,
            ):
                yield event
        except A2AError:
            raise
        except Exception as err:
            raise _internal("on_subscribe_to_task", err) from err

    @_guarded
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        task = await snapshot(self.client, self.agent, task_ref(params.id))
        return apply_history_length(task, params)

    @_guarded
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        ref = task_ref(params.id)
        task = await snapshot(self.client, self.agent, ref)
        if task.status.state in TERMINAL or task.status.state == TaskState.TASK_STATE_SUBMITTED:
            raise TaskNotCancelableError(
                message=f"task {params.id!r} is {_state_name(task.status.state)}: no turn runs"
            )
        turn = get_turn(self.client, ref.turn_id(self.agent))
        await turn.cancel()
        # Its repair is quick; the answer then says how the turn ended.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_ended(turn), CANCEL_WAIT_SECONDS)
        task = await snapshot(self.client, self.agent, ref)
        if task.status.state not in TERMINAL:
            # The cancellation is asked for; the turn has not ended yet.
            task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_CANCELED))
            task.status.timestamp.GetCurrentTime()
        return task

    @_guarded
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        return await list_tasks(self.client, self.agent, params)

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


def _state_name(state: TaskState) -> str:
    return TaskState.Name(state).removeprefix("TASK_STATE_").lower().replace("_", "-")


def _closed_context(context_id: str) -> UnsupportedOperationError:
    return UnsupportedOperationError(
        message=f"context {context_id!r} is closed: it takes no more messages; start a new one"
    )
