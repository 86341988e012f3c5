"""Agents served over A2A (the agent-to-agent protocol, ``a2a-sdk``): one JSON-RPC endpoint and
agent card per agent, thin over the session client API.

The mapping (the documentation's *Serving agents: A2A*):

- an A2A task is a turnkeep session: its id is the task's, and the task's context id is the
  same id, so a follow-up naming either reaches the same session;
- each message is a turn (``SessionHandle.send``);
- ``input-required`` is a call waiting for approval; the client's next message decides it;
- streaming carries the running turn's live text (artifact updates) and its messages (status
  updates);
- ``tasks/cancel`` cancels the running turn, which is repaired; the session goes on.

There is no task store: the SDK's ``DefaultRequestHandler`` keeps each task's state in a
``TaskStore`` and its running executions in memory, a second copy of what the session holds.
``SessionRequestHandler`` answers every request from the session itself, so a gateway that
restarts loses nothing: a task id names its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Sequence,
)
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ParamSpec, TypeVar

try:
    from a2a.server.context import ServerCallContext
except ImportError as err:  # an optional dependency: say which
    raise ImportError("serving A2A needs a2a-sdk: pip install 'turnkeep[a2a]'") from err
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import (
    agent_card_to_dict,
    build_error_response,
)
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    HTTPAuthSecurityScheme,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StringList,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
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
from google.protobuf import json_format, struct_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message as AsgiMessage
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.live import MessageEvent, Restarted, StreamEvent, TextDelta, ToolCallStart
from turnkeep.client.sessions import SessionClosedError, SessionHandle, get_session, open_session
from turnkeep.client.turns import TurnHandle, get_turn, query_retrying
from turnkeep.config.settings import Settings
from turnkeep.workflows.approval import PendingCall
from turnkeep.workflows.messages import Message as TurnMessage
from turnkeep.workflows.session_io import SESSION_WORKFLOW_NAME, NewMessageMode
from turnkeep.workflows.session_workflow import SessionWorkflow
from turnkeep.workflows.turn_io import agent_task_queue
from turnkeep.workflows.turn_workflow import TurnWorkflow

log = logging.getLogger(__name__)

# A task id (and context id) as a client may name it: it becomes part of a workflow id.
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MAX_TEXT = 100_000  # characters of one message's text
MAX_PARTS = 32
MAX_BODY = 1_048_576  # bytes of one JSON-RPC request
# How often a follower asks the turn for calls waiting for approval while the model's tool
# calls have no results yet (a waiting call shows in no message: the turn is asked): soon
# after the calls start, then less and less often while the tools run.
APPROVAL_POLL_SECONDS = 0.2
MAX_APPROVAL_POLL_SECONDS = 2.0
# How long tasks/cancel waits for the cancelled turn to end (its repair) before answering.
CANCEL_WAIT_SECONDS = 10.0
# A plain-text answer to a call waiting: "approve", or "deny" with an optional reason.
_TEXT_DECISION = re.compile(r"\s*(approve|deny)\b[\s:,.-]*(.*)", re.IGNORECASE | re.DOTALL)

_FINAL_STATES = {
    WorkflowExecutionStatus.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    WorkflowExecutionStatus.CANCELED: TaskState.TASK_STATE_CANCELED,
}


def session_id_for(agent: str, task_id: str) -> str:
    """The session a task of ``agent`` is: deterministic, so any gateway finds it. The task id
    holds no ``:``, so two agents' tasks never share a session id."""
    return f"a2a:{agent}:{task_id}"


@dataclass(frozen=True)
class Caller:
    """Who a request is, as ``authorize`` (the gateway's keys) says: the name its decisions are
    audited under (``<name> via a2a``), and whether it may decide calls waiting for approval."""

    name: str
    decide: bool = True


class Refused(Exception):
    """Raised by ``authorize``: the request is refused with ``status`` (401, 403) and a line."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


Authorize = Callable[[Request, str], Caller]
# Routes without ``authorize`` (an app on loopback, behind a proxy that checks callers).
OPEN = Caller(name="anyone", decide=True)
_CALLER = "turnkeep.a2a.caller"  # the request scope's key for the Caller
# Headers the SDK would otherwise copy into each request's context: none of its business.
_PRIVATE_HEADERS = ("authorization", "proxy-authorization", "cookie")


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's request context, with the caller and without credentials."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        headers = context.state.get("headers", {})
        for name in _PRIVATE_HEADERS:
            headers.pop(name, None)
        context.state["caller"] = request.scope.get(_CALLER, OPEN)
        return context


def _caller(context: ServerCallContext) -> Caller:
    caller = context.state.get("caller")
    return caller if isinstance(caller, Caller) else OPEN


# --- what a client sends ------------------------------------------------------------------------


class DecisionPart(BaseModel):
    """A data part deciding a call that waits for approval."""

    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1, max_length=200)
    approve: bool
    reason: str | None = Field(default=None, max_length=2_000)
    # Approve the call with these arguments instead of the model's.
    arguments: dict[str, Any] | None = None


class Incoming(BaseModel):
    """A client's message, validated: text for a turn, or decisions on waiting calls."""

    text: str = Field(default="", max_length=MAX_TEXT)
    decisions: list[DecisionPart] = Field(default_factory=list)


def read_message(message: Message) -> Incoming:
    """The message's text and decisions; raises ``InvalidParamsError`` naming what is wrong."""
    if message.role != Role.ROLE_USER:
        raise InvalidParamsError(message="the message's role must be ROLE_USER")
    if not message.parts:
        raise InvalidParamsError(message="the message has no parts")
    if len(message.parts) > MAX_PARTS:
        raise InvalidParamsError(message=f"the message has more than {MAX_PARTS} parts")
    texts: list[str] = []
    decisions: list[Any] = []
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            decisions.append(_whole_numbers(json_format.MessageToDict(part.data)))
        else:
            raise InvalidParamsError(
                message=f"part {index} is {kind or 'empty'}: only text and data parts are taken"
            )
    try:
        return Incoming.model_validate({"text": "\n".join(texts), "decisions": decisions})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidParamsError(message=f"invalid message: {where}: {first['msg']}") from None


def _whole_numbers(value: Any) -> Any:
    """A data part's JSON with whole numbers as ints: protobuf's ``Value`` makes every number
    a double, and edited arguments go to tools that expect ``3``, not ``3.0``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def _task_id(value: str, what: str = "task id") -> str:
    if not TASK_ID.fullmatch(value):
        raise InvalidParamsError(
            message=f"invalid {what}: 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


# --- what the server answers -------------------------------------------------------------------


def _data(value: Any) -> Part:
    return Part(data=json_format.ParseDict(value, struct_pb2.Value()))


def _agent_message(task_id: str, message_id: str, parts: Sequence[Part]) -> Message:
    return Message(
        message_id=message_id,
        task_id=task_id,
        context_id=task_id,
        role=Role.ROLE_AGENT,
        parts=list(parts),
    )


def to_a2a(message: TurnMessage, task_id: str, message_id: str) -> Message | None:
    """A turn's message as A2A's: its text, and its tool calls or results as data parts;
    None when it has neither."""
    parts: list[Part] = []
    if message.text:
        parts.append(Part(text=message.text))
    if message.tool_calls:
        calls = [
            {"call_id": call_id, "name": call.name, "arguments": call.arguments}
            for call_id, call in message.tool_calls.items()
        ]
        parts.append(_data({"tool_calls": calls}))
    if message.tool_results:
        results = [
            {"call_id": call_id, "is_error": result.is_error, "text": result.text}
            for call_id, result in message.tool_results.items()
        ]
        parts.append(_data({"tool_results": results}))
    if not parts:
        return None
    role = (
        Role.ROLE_USER if message.role == "user" and not message.tool_results else Role.ROLE_AGENT
    )
    return Message(
        message_id=message_id, task_id=task_id, context_id=task_id, role=role, parts=parts
    )


def approval_message(task_id: str, calls: Sequence[PendingCall]) -> Message:
    """The ``input-required`` status message: each waiting call with its arguments, and how to
    answer."""
    listed = "\n".join(f"- {c.name} (call {c.call_id}): {_json(c.arguments)}" for c in calls)
    text = (
        f"Waiting for approval:\n{listed}\n"
        'Answer "approve" or "deny: <reason>" (every call listed), or one data part per call: '
        '{"call_id": ..., "approve": true|false, "reason": ..., "arguments": {...}}.'
    )
    waiting = [c.model_dump(mode="json", exclude_none=True) for c in calls]
    ids = "-".join(c.call_id for c in calls)
    return _agent_message(
        task_id, f"{task_id}/approval/{ids}", [Part(text=text), _data({"approvals": waiting})]
    )


def _json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 2_000 else text[:1_999] + "…"


def _status(
    task_id: str, state: TaskState, message: Message | None = None
) -> TaskStatusUpdateEvent:
    status = TaskStatus(state=state)
    if message is not None:
        status.message.CopyFrom(message)
    status.timestamp.GetCurrentTime()
    return TaskStatusUpdateEvent(task_id=task_id, context_id=task_id, status=status)


def _answer_artifact(turn: str, text: str) -> Artifact:
    return Artifact(artifact_id=f"answer-{turn}", name="answer", parts=[Part(text=text)])


# --- the handler -------------------------------------------------------------------------------

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

    async def _existing(self, task_id: str) -> tuple[SessionHandle, bool]:
        """The session task ``task_id`` is, and whether it runs; ``TaskNotFoundError`` if none."""
        session = get_session(self.client, session_id_for(self.agent, _task_id(task_id)))
        try:
            described = await session.handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise TaskNotFoundError(message=f"no task {task_id!r}") from None
            raise
        if described.workflow_type != SESSION_WORKFLOW_NAME:
            raise TaskNotFoundError(message=f"no task {task_id!r}")
        return session, described.status == WorkflowExecutionStatus.RUNNING

    async def _for_message(self, message: Message, incoming: Incoming) -> tuple[str, SessionHandle]:
        """The task a message goes to: the one it names (which must exist), else the one its
        context id names, else a new one, started only for a message it can take."""
        task_id, context_id = message.task_id, message.context_id
        if task_id and context_id and task_id != context_id:
            raise InvalidParamsError(
                message="contextId must be the taskId: a task is one conversation"
            )
        key = task_id or (_task_id(context_id, "context id") if context_id else "")
        if key:
            try:
                session, running = await self._existing(key)
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
    ) -> tuple[str, SessionHandle, _Follow]:
        """Validate the message, then send it as a turn or decide the calls it answers; what
        to follow next."""
        incoming = read_message(params.message)
        task_id, session = await self._for_message(params.message, incoming)
        progress = await session.progress()
        running = progress.turn
        waiting: list[PendingCall] = []
        if running is not None:
            waiting = await _waiting(get_turn(self.client, running.workflow_id))
        if waiting and running is not None:
            if not _caller(context).decide:
                raise InvalidRequestError(message="this caller may not decide calls")
            decisions = incoming.decisions or _text_decisions(incoming.text, waiting)
            turn = get_turn(self.client, running.workflow_id)
            # Counted before deciding: what the decision sets off is followed, however fast.
            done = (await turn.handle.query(TurnWorkflow.progress)).count
            for decision in decisions:
                try:
                    await turn.decide(
                        decision.call_id,
                        decision.approve,
                        decision.reason,
                        by=f"{_caller(context).name} via a2a",
                        arguments=decision.arguments,
                    )
                except WorkflowUpdateFailedError as err:
                    raise InvalidParamsError(message=f"not decided: {_cause(err)}") from None
            return (
                task_id,
                session,
                _Follow(
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
            _Follow(start=progress.count, turn=sent.turn, turn_id=sent.turn_id, ask_first=False),
        )

    async def _follow(
        self, session: SessionHandle, task_id: str, follow: _Follow, *, live: bool
    ) -> AsyncIterator[TaskStatusUpdateEvent | TaskArtifactUpdateEvent]:
        """The turn's events until it ends (a final status) or a call waits (input-required)."""
        turn = get_turn(self.client, follow.turn_id)
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
                        pause = min(
                            max(pause * 2, APPROVAL_POLL_SECONDS), MAX_APPROVAL_POLL_SECONDS
                        )
                        # The session's running turn: a message queued behind a turn whose
                        # call waits is answered only once that call is decided.
                        waiting = await self._waiting_in(session)
                        if waiting:
                            yield _status(
                                task_id,
                                TaskState.TASK_STATE_INPUT_REQUIRED,
                                approval_message(task_id, waiting),
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
                            context_id=task_id,
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
                        converted = to_a2a(message, task_id, f"{task_id}/{index}")
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
                            yield _status(task_id, TaskState.TASK_STATE_WORKING, converted)
            finally:
                if next_event is not None and not next_event.done():
                    next_event.cancel()
                    with contextlib.suppress(BaseException):
                        await next_event
        state, text = await _turn_end(turn)
        if state == TaskState.TASK_STATE_COMPLETED and answer is not None:
            yield TaskArtifactUpdateEvent(
                task_id=task_id,
                context_id=task_id,
                artifact=_answer_artifact(str(follow.turn), answer),
                last_chunk=True,
            )
            text = answer
        final = _agent_message(task_id, f"{follow.turn_id}/end", [Part(text=text)])
        yield _status(task_id, state, final)

    async def _waiting_in(self, session: SessionHandle) -> list[PendingCall]:
        """The calls of the session's running turn that wait for a decision."""
        running = (await session.progress()).turn
        return [] if running is None else await _waiting(get_turn(self.client, running.workflow_id))

    async def _transcript(self, session: SessionHandle) -> list[TurnMessage]:
        """The messages of the session's ended turns."""
        messages: list[TurnMessage] = await query_retrying(
            session.handle, SessionWorkflow.transcript, 0
        )
        return messages

    async def _history(self, task_id: str, session: SessionHandle) -> list[Message]:
        return _history(task_id, await self._transcript(session))

    async def _snapshot(self, task_id: str, session: SessionHandle, running: bool) -> Task:
        """The task as its session stands: every ended turn's messages, and its state."""
        message: Message | None = None
        artifacts: list[Artifact] = []
        if not running:
            closed = await session.result()
            transcript = closed.transcript
            state: TaskState = TaskState.TASK_STATE_COMPLETED
        else:
            progress = await session.progress()
            transcript = await self._transcript(session)
            if progress.turn is not None:
                waiting = await _waiting(get_turn(self.client, progress.turn.workflow_id))
                state = (
                    TaskState.TASK_STATE_INPUT_REQUIRED if waiting else TaskState.TASK_STATE_WORKING
                )
                if waiting:
                    message = approval_message(task_id, waiting)
            elif progress.turns_ended == 0:
                state = TaskState.TASK_STATE_SUBMITTED
            else:
                last = f"{session.session_id}/turn-{progress.turns_ended}"
                state, text = await _turn_end(get_turn(self.client, last))
                if state != TaskState.TASK_STATE_COMPLETED:
                    message = _agent_message(task_id, f"{last}/end", [Part(text=text)])
        history = _history(task_id, transcript)
        if state == TaskState.TASK_STATE_COMPLETED and transcript:
            final = transcript[-1]
            if final.role == "assistant" and final.text:
                message = to_a2a(final, task_id, f"{task_id}/{len(transcript) - 1}")
                artifacts.append(_answer_artifact("last", final.text))
        status = TaskStatus(state=state)
        if message is not None:
            status.message.CopyFrom(message)
        return Task(
            id=task_id, context_id=task_id, status=status, history=history, artifacts=artifacts
        )

    # -- RequestHandler

    @_guarded
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task:
        task_id, session, follow = await self._begin(params, context)
        final: TaskStatusUpdateEvent | None = None
        artifacts: list[Artifact] = []
        if not params.configuration.return_immediately:
            async for event in self._follow(session, task_id, follow, live=False):
                if isinstance(event, TaskStatusUpdateEvent):
                    final = event
                elif event.artifact.name == "answer":
                    artifacts.append(event.artifact)
        if final is None:  # return_immediately: the task as it stands
            task = await self._snapshot(task_id, session, running=True)
        else:
            config = params.configuration
            unwanted = config.HasField("history_length") and config.history_length == 0
            history = [] if unwanted else await self._history(task_id, session)
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
            async for event in self._follow(session, task_id, follow, live=True):
                yield event
        except A2AError:
            raise
        except Exception as err:
            raise _internal("on_message_send_stream", err) from err

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent, None]:
        try:
            session, running = await self._existing(params.id)
            progress = await session.progress() if running else None
            if progress is None or progress.turn is None:
                raise UnsupportedOperationError(message=f"task {params.id!r} has no turn running")
            yield await self._snapshot(params.id, session, running=True)
            turn = progress.turn
            done = (
                await get_turn(self.client, turn.workflow_id).handle.query(TurnWorkflow.progress)
            ).count
            follow = _Follow(
                start=turn.start + done,
                turn=_turn_number(turn.workflow_id),
                turn_id=turn.workflow_id,
                ask_first=True,
            )
            async for event in self._follow(session, params.id, follow, live=True):
                yield event
        except A2AError:
            raise
        except Exception as err:
            raise _internal("on_subscribe_to_task", err) from err

    @_guarded
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        session, running = await self._existing(params.id)
        return apply_history_length(await self._snapshot(params.id, session, running), params)

    @_guarded
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        session, running = await self._existing(params.id)
        progress = await session.progress() if running else None
        if progress is None or progress.turn is None:
            raise TaskNotCancelableError(message=f"task {params.id!r} has no turn running")
        turn = get_turn(self.client, progress.turn.workflow_id)
        await turn.cancel()
        # Its repair is quick; the answer then says how the turn ended.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_ended(turn), CANCEL_WAIT_SECONDS)
        task = await self._snapshot(params.id, session, running=True)
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


def _history(task_id: str, transcript: Sequence[TurnMessage]) -> list[Message]:
    """A session's transcript as a task's history (ids by index: the same on every read)."""
    return [
        converted
        for i, m in enumerate(transcript)
        if (converted := to_a2a(m, task_id, f"{task_id}/{i}")) is not None
    ]


class _Follow(BaseModel):
    """Where to follow a turn from: the transcript index, the turn's number and id, and
    whether a call may already wait for a decision (a turn already running)."""

    start: int
    turn: int
    turn_id: str
    ask_first: bool


async def _as_events(messages: AsyncIterator[TurnMessage]) -> AsyncIterator[StreamEvent]:
    async for message in messages:
        yield MessageEvent(message=message)


async def _waiting(turn: TurnHandle) -> list[PendingCall]:
    """The turn's calls waiting for a decision; none once it has ended (or not started)."""
    try:
        return await turn.pending_approvals()
    except RPCError:
        return []


async def _ended(turn: TurnHandle) -> None:
    with contextlib.suppress(Exception):
        await turn.handle.result()


async def _turn_end(turn: TurnHandle) -> tuple[TaskState, str]:
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
            "the turn was cancelled: its conversation is repaired, and the task takes new messages",
        )
    if state == TaskState.TASK_STATE_FAILED:
        return state, f"the turn ended {name}: `turnkeep show {turn.workflow_id}` says why"
    return state, "the turn has ended"


def _text_decisions(text: str, waiting: Sequence[PendingCall]) -> list[DecisionPart]:
    """A plain-text answer to the calls waiting: "approve" or "deny[: reason]", for them all."""
    match = _TEXT_DECISION.fullmatch(text)
    if match is None:
        names = ", ".join(f"{c.name} ({c.call_id})" for c in waiting)
        raise InvalidParamsError(
            message=f"calls wait for a decision ({names}): answer approve or deny, "
            'or a data part {"call_id", "approve"}'
        )
    approve = match.group(1).lower() == "approve"
    reason = match.group(2).strip() or None
    return [
        DecisionPart(call_id=c.call_id, approve=approve, reason=None if approve else reason)
        for c in waiting
    ]


def _turn_number(turn_id: str) -> int:
    """The number in a session turn's id, ``<session id>/turn-<n>``."""
    return int(turn_id.rsplit("/turn-", 1)[1])


def _cause(err: WorkflowUpdateFailedError) -> str:
    cause = err.cause
    return str(getattr(cause, "message", None) or cause or err).splitlines()[0]


def _new_id() -> str:
    return uuid.uuid4().hex


# --- the routes -------------------------------------------------------------------------------


def agent_card(name: str, settings: Settings, url: str, *, bearer: bool = True) -> AgentCard:
    """The card of agent ``name``: its description (never its instruction), one skill, the
    JSON-RPC endpoint at ``url``, streaming, and bearer authentication."""
    options = settings.agents[name]
    description = options.description or f"The turnkeep agent {name}."
    modes = ["text/plain", "application/json"]
    card = AgentCard(
        name=name,
        description=description,
        version=_version(),
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=modes,
        default_output_modes=modes,
        skills=[
            AgentSkill(
                id=name,
                name=name,
                description=description,
                tags=["turnkeep", *options.servers, *(f"agent:{a}" for a in options.agents)],
            )
        ],
    )
    if bearer:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer", description="an API key of the gateway"
                )
            )
        )
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    return card


def _version() -> str:
    try:
        return version("turnkeep")
    except PackageNotFoundError:
        return "0"


def a2a_routes(
    client: Client,
    settings: Settings,
    agents: Sequence[str] | None = None,
    *,
    prefix: str = "/a2a",
    task_queue: str | Callable[[str], str] | None = None,
    public_url: str | None = None,
    bearer: bool = True,
    authorize: Authorize | None = None,
    max_body: int = MAX_BODY,
) -> list[BaseRoute]:
    """Starlette routes serving ``agents`` (default: every agent of ``settings``) over A2A:
    ``{prefix}/{agent}/`` takes JSON-RPC (A2A 1.0, and 0.3's method names), and
    ``{prefix}/{agent}/.well-known/agent-card.json`` is the agent's card. Any other agent gets
    a JSON-RPC error (its card, a 404), nothing started.

    ``task_queue``: where sessions run, one queue or a function of the agent (by default each
    agent's queue, as ``turnkeep chat`` starts them); ``public_url``: the base URL clients
    reach these routes at, for the card (by default the URL the card was asked at);
    ``bearer``: whether the card says a bearer key is required. ``authorize(request, agent)``
    says who a request is (a ``Caller``) or raises ``Refused``; it is asked first, for the card
    too. Without it every request is served as ``OPEN``: serve such routes on loopback only,
    or behind something that checks callers. ``max_body``: the largest request, in bytes."""
    names = list(settings.agents) if agents is None else list(agents)
    unknown = sorted(set(names) - set(settings.agents))
    if unknown:
        raise ValueError(f"no such agents in the settings: {', '.join(unknown)}")
    prefix = prefix.rstrip("/")
    placeholder = "http://localhost/"  # the card's URL is set per request
    dispatchers: dict[str, JsonRpcDispatcher] = {}
    cards: dict[str, AgentCard] = {}
    for name in names:
        cards[name] = agent_card(name, settings, placeholder, bearer=bearer)
        handler = SessionRequestHandler(
            client,
            name,
            task_queue=(
                task_queue(name)
                if callable(task_queue)
                else task_queue or agent_task_queue(settings.task_queue, name)
            ),
            on_new_message=settings.agents[name].on_new_message,
            card=cards[name],
        )
        dispatchers[name] = JsonRpcDispatcher(
            handler, context_builder=_ContextBuilder(), enable_v0_3_compat=True
        )

    async def rpc(request: Request) -> Response:
        name = request.path_params["agent"]
        try:
            request.scope[_CALLER] = authorize(request, name) if authorize else OPEN
        except Refused as refused:
            return _rpc_error(
                InvalidRequestError(message=refused.message), refused.status, refused.headers
            )
        dispatcher = dispatchers.get(name)
        if dispatcher is None:
            return _rpc_error(
                InvalidRequestError(message=f"no agent {_shown(name)} is served here")
            )
        body = await _bounded_body(request, max_body)
        if body is None:
            return _rpc_error(InvalidRequestError(message=f"the request is over {max_body} bytes"))
        return await dispatcher.handle_requests(Request(request.scope, _replay(body, request)))

    async def card(request: Request) -> Response:
        name = request.path_params["agent"]
        try:
            if authorize is not None:
                authorize(request, name)
        except Refused as refused:
            return JSONResponse(
                {"error": refused.message}, status_code=refused.status, headers=refused.headers
            )
        if name not in cards:
            return JSONResponse(
                {"error": f"no agent {_shown(name)} is served here"}, status_code=404
            )
        served = AgentCard()
        served.CopyFrom(cards[name])
        base = public_url.rstrip("/") + f"{prefix}/{name}/" if public_url else _rpc_url(request)
        served.supported_interfaces[0].url = base
        return JSONResponse(agent_card_to_dict(served))

    return [
        Route(f"{prefix}/{{agent}}/", rpc, methods=["POST"]),
        Route(f"{prefix}/{{agent}}{AGENT_CARD_WELL_KNOWN_PATH}", card, methods=["GET"]),
    ]


def a2a_app(
    client: Client, settings: Settings, agents: Sequence[str] | None = None, **options: Any
) -> Starlette:
    """``a2a_routes`` as an app of their own (no authentication: loopback or behind a proxy)."""
    return Starlette(routes=a2a_routes(client, settings, agents, **options))


def _rpc_url(request: Request) -> str:
    path = request.url.path.removesuffix(AGENT_CARD_WELL_KNOWN_PATH).rstrip("/") + "/"
    return str(request.url.replace(path=path, query=""))


def _shown(name: str) -> str:
    return repr(name if len(name) <= 60 else name[:59] + "…")


def _rpc_error(
    error: A2AError, status: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(build_error_response(None, error), status_code=status, headers=headers)


async def _bounded_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None past ``limit`` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _replay(body: bytes, request: Request) -> Callable[[], Awaitable[AsgiMessage]]:
    """An ASGI receive that gives ``body`` once, then the connection's own messages (a
    streaming answer listens there for the client leaving)."""
    given = False

    async def receive() -> AsgiMessage:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    return receive
