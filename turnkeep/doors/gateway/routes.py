"""The API's handlers: each checks the key, the workflow and the body, then makes one call of
the client API (``turnkeep.client``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.forks import ForkError, fork
from turnkeep.client.queries import query_retrying
from turnkeep.client.sessions import SessionClosedError, get_session, open_session
from turnkeep.client.turns import get_turn, start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.approval import PendingCall
from turnkeep.contract.messages import Message
from turnkeep.contract.turn_io import TurnInput
from turnkeep.doors.gateway.access import Access, Kind
from turnkeep.doors.gateway.auth import ALL_AGENTS, ApiKey, KeyRing
from turnkeep.doors.gateway.errors import ApiError
from turnkeep.doors.gateway.fanout import Hub, TooManyWatchers, turn_outcome
from turnkeep.doors.gateway.limits import describe, read_json
from turnkeep.doors.gateway.models import (
    MAX_INDEX,
    AgentInfo,
    AgentList,
    Approval,
    ApprovalList,
    DecideCall,
    Fork,
    Forked,
    MessageSent,
    OpenSession,
    RewindSession,
    SendMessage,
    SessionOpened,
    SessionRef,
    SessionState,
    StartTurn,
    TurnRef,
    TurnStarted,
    TurnState,
)
from turnkeep.doors.gateway.sse import EventStream
from turnkeep.workflows import visibility
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME, TurnWorkflow

log = logging.getLogger(__name__)

# A query or an update waits for a worker of the workflow's queue: without one, the request
# says so instead of hanging.
WORKER_SECONDS = 20.0
_QUERY_TIMEOUT = timedelta(seconds=WORKER_SECONDS)


@dataclass
class Gateway:
    """What the handlers share: the client, the config, the feeds, and where turns run."""

    client: Client
    settings: Settings
    hub: Hub
    access: Access
    task_queue: Callable[[str], str]
    # The keys the API accepts: a mounted app (A2A) authenticates its callers with them too.
    keys: KeyRing
    web_ui: str | None = None

    def key(self, request: Request) -> ApiKey:
        key: ApiKey = request.state.key
        return key

    def web_link(self, workflow_id: str) -> str | None:
        if not self.web_ui:
            return None
        namespace = quote(self.client.namespace, safe="")
        workflow = quote(workflow_id, safe="")
        return f"{self.web_ui.rstrip('/')}/namespaces/{namespace}/workflows/{workflow}"

    @property
    def max_body(self) -> int:
        return self.settings.gateway.max_body_bytes


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


# What `?after=` and `Last-Event-ID` may be: -1 or a message index, in ASCII digits (`int()`
# would also take spaces, `+`, `_` and other scripts' digits, which the document does not allow).
_INDEX = re.compile(r"-1|[0-9]{1,19}")


def _start(request: Request) -> int:
    """Where a stream starts: after the message ``?after=N`` or ``Last-Event-ID`` names (both
    checked; ``after`` wins)."""
    start = 0
    for source, values in (
        ("Last-Event-ID", request.headers.getlist("last-event-id")),
        ("after", request.query_params.getlist("after")),
    ):
        if not values:
            continue
        if len(values) > 1 or not _INDEX.fullmatch(values[0]) or int(values[0]) > MAX_INDEX:
            raise ApiError(400, f"{source} must be one message index (an integer, -1 or more)")
        start = int(values[0]) + 1
    return start


def query_checked(endpoint: Callable[[Request], Any], *allowed: str) -> Callable[[Request], Any]:
    """``endpoint`` refusing a query parameter it does not read, as a body's unknown key is
    refused: a misspelt ``?after=`` is a mistake worth naming, not a stream from the start."""

    @functools.wraps(endpoint)
    async def checked(request: Request) -> Any:
        unknown = sorted(set(request.query_params.keys()) - set(allowed))
        if unknown:
            raise ApiError(400, f"unknown query parameter {unknown[0]!r}")
        return await endpoint(request)

    return checked


# -- agents -----------------------------------------------------------------------------------


async def list_agents(request: Request) -> Response:
    gw = _gateway(request)
    key = gw.key(request)
    agents = [
        AgentInfo(name=name, description=agent.description)
        for name, agent in gw.settings.agents.items()
        if key.may_use(name)
    ]
    return _json(AgentList(agents=agents))


# -- turns ------------------------------------------------------------------------------------


async def post_turn(request: Request) -> Response:
    gw = _gateway(request)
    key = gw.key(request)
    body = await read_json(request, StartTurn, gw.max_body)
    gw.access.agent(key, body.agent)
    try:
        turn = TurnInput.model_validate(
            {
                "agent": body.agent,
                "messages": [body.prompt],
                # The key's, whatever the body asked (which can only lower the priority).
                "priority": key.priority_of(body.priority),
                "tenant": key.tenant,
            }
        )
    except ValidationError as err:  # what the turn itself refuses (a prompt too long, say)
        raise ApiError(422, describe(err).replace("messages.0", "prompt")) from None
    handle = await start_turn(
        gw.client,
        turn,
        workflow_id=f"turn-{body.agent}-{uuid.uuid4().hex[:12]}",
        task_queue=gw.task_queue(body.agent),
    )
    log.info("key %s started turn %s", key.name, handle.workflow_id)
    return _json(
        TurnStarted(turn_id=handle.workflow_id, web_ui=gw.web_link(handle.workflow_id)), 201
    )


async def get_turn_state(request: Request) -> Response:
    gw = _gateway(request)
    turn_id = request.path_params["turn_id"]
    found = await gw.access.workflow(gw.key(request), "turn", turn_id)
    status, error = await turn_outcome(gw.client, turn_id)
    result = None
    if status == "completed":
        try:
            result = await get_turn(gw.client, turn_id).result()
        except WorkflowFailureError as err:  # it continued as new and then failed meanwhile
            status, error = "failed", " ".join(str(err.cause or err).split())
    del found
    return _json(TurnState(turn_id=turn_id, status=status, result=result, error=error))


async def stream_turn(request: Request) -> Response:
    return await _stream(request, "turn", request.path_params["turn_id"])


async def cancel_turn(request: Request) -> Response:
    gw = _gateway(request)
    turn_id = request.path_params["turn_id"]
    found = await gw.access.workflow(gw.key(request), "turn", turn_id)
    if not found.running:
        raise ApiError(409, f"turn {turn_id!r} has ended; there is nothing to cancel")
    try:
        await get_turn(gw.client, turn_id).cancel()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:  # it ended since the check above
            raise ApiError(409, f"turn {turn_id!r} has ended; there is nothing to cancel") from None
        raise
    log.info("key %s cancelled turn %s", gw.key(request).name, turn_id)
    return _json(TurnRef(turn_id=turn_id), 202)


async def turn_approvals(request: Request) -> Response:
    gw = _gateway(request)
    turn_id = request.path_params["turn_id"]
    found = await gw.access.workflow(gw.key(request), "turn", turn_id)
    calls = await _pending(gw, turn_id) if found.running else []
    return _json(ApprovalList(approvals=[_approval(turn_id, call) for call in calls]))


async def decide(request: Request) -> Response:
    gw = _gateway(request)
    key = gw.key(request)
    turn_id, call_id = request.path_params["turn_id"], request.path_params["call_id"]
    if not key.decide:
        raise ApiError(403, "this key may not decide tool calls")
    body = await read_json(request, DecideCall, gw.max_body)
    found = await gw.access.workflow(key, "turn", turn_id)
    if not found.running:
        raise ApiError(409, f"call {call_id!r} is not waiting: turn {turn_id!r} has ended")
    try:
        async with asyncio.timeout(WORKER_SECONDS):
            decision = body.decision(call_id, by=f"gateway key {key.name}")
            record = await get_turn(gw.client, turn_id).send_decision(decision)
    except WorkflowUpdateFailedError as err:
        why = _refusal(err)
        raise ApiError(409, f"call {call_id!r} is not waiting for a decision: {why}") from None
    except TimeoutError:
        raise ApiError(504, f"no worker took the decision for turn {turn_id!r}") from None
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise ApiError(409, f"call {call_id!r} is not waiting: the turn has ended") from None
        raise
    log.info("key %s decided call %s of turn %s", key.name, call_id, turn_id)
    return Response(record.model_dump_json(), media_type="application/json")


async def all_approvals(request: Request) -> Response:
    gw = _gateway(request)
    key = gw.key(request)
    names = [name for name in gw.settings.agents if key.may_use(name)]
    if not names:
        return _json(ApprovalList(approvals=[]))
    query = (
        f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus = 'Running' AND "
        f"{visibility.STATUS.name} = '{visibility.TurnStatus.AWAITING_APPROVAL.value}'"
    )
    if ALL_AGENTS not in key.agents:
        quoted = ", ".join("'" + name.replace("'", "") + "'" for name in names)
        query += f" AND {visibility.AGENT.name} IN ({quoted})"
    listed: list[tuple[str, list[PendingCall]]] = []
    async for execution in gw.client.list_workflows(query, limit=200):
        agent = execution.typed_search_attributes.get(visibility.AGENT)
        if agent is None or not key.may_use(agent):
            continue
        try:
            listed.append((execution.id, await _pending(gw, execution.id)))
        except (ApiError, RPCError):
            continue  # it ended meanwhile, or no worker answers: not listable now
    # A call waiting in a child turn is listed under the turn above it, not twice.
    children = {call.turn_id for _, calls in listed for call in calls if call.turn_id}
    approvals = [
        _approval(turn_id, call)
        for turn_id, calls in listed
        if turn_id not in children
        for call in calls
    ]
    return _json(ApprovalList(approvals=approvals))


async def _pending(gw: Gateway, turn_id: str) -> list[PendingCall]:
    try:
        return await get_turn(gw.client, turn_id).pending_approvals(rpc_timeout=_QUERY_TIMEOUT)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return []
        if err.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
            raise ApiError(504, f"no worker answered for turn {turn_id!r}") from None
        raise


def _approval(turn_id: str, call: PendingCall) -> Approval:
    return Approval.model_validate(
        {**call.model_dump(), "turn_id": turn_id, "child_turn_id": call.turn_id}
    )


# -- sessions ---------------------------------------------------------------------------------


async def post_session(request: Request) -> Response:
    gw = _gateway(request)
    key = gw.key(request)
    body = await read_json(request, OpenSession, gw.max_body)
    gw.access.agent(key, body.agent)
    agent = gw.settings.agents[body.agent]
    session = await open_session(
        gw.client,
        agent=body.agent,
        session_id=f"session-{body.agent}-{uuid.uuid4().hex[:12]}",
        task_queue=gw.task_queue(body.agent),
        on_new_message=agent.on_new_message,
        priority=key.priority_of(body.priority),
        tenant=key.tenant,
    )
    log.info("key %s opened session %s", key.name, session.session_id)
    return _json(SessionOpened(session_id=session.session_id), 201)


async def get_session_state(request: Request) -> Response:
    gw = _gateway(request)
    session_id = request.path_params["session_id"]
    found = await gw.access.workflow(gw.key(request), "session", session_id)
    session = get_session(gw.client, session_id)
    messages: list[Message]
    if not found.running:
        try:
            messages = list((await session.result()).transcript)
        except WorkflowFailureError:
            messages = []
        return _json(
            SessionState(session_id=session_id, agent=found.agent, open=False, messages=messages)
        )
    try:
        async with asyncio.timeout(WORKER_SECONDS):
            progress = await session.progress()
            messages = [m async for m in session.transcript(0, progress.count)]
            turn = progress.turn
            if turn is not None and len(messages) >= turn.start:
                messages += await query_retrying(
                    get_turn(gw.client, turn.workflow_id).handle,
                    TurnWorkflow.transcript,
                    len(messages) - turn.start,
                )
    except TimeoutError:
        raise ApiError(504, f"no worker answered for session {session_id!r}") from None
    return _json(
        SessionState(
            session_id=session_id, agent=found.agent, open=not progress.closed, messages=messages
        )
    )


async def send_message(request: Request) -> Response:
    gw = _gateway(request)
    session_id = request.path_params["session_id"]
    body = await read_json(request, SendMessage, gw.max_body)
    found = await gw.access.workflow(gw.key(request), "session", session_id)
    if not found.running:
        raise ApiError(409, f"session {session_id!r} has ended; open a new one")
    try:
        async with asyncio.timeout(WORKER_SECONDS):
            sent = await get_session(gw.client, session_id).send(body.text)
    except WorkflowUpdateFailedError as err:
        why = _refusal(err)
        raise ApiError(409, f"session {session_id!r} refused the message: {why}") from None
    except SessionClosedError:
        raise ApiError(409, f"session {session_id!r} has ended; open a new one") from None
    except TimeoutError:
        raise ApiError(504, f"no worker took the message for session {session_id!r}") from None
    sent_turn = MessageSent(turn=sent.turn, turn_id=sent.turn_id, web_ui=gw.web_link(sent.turn_id))
    return _json(sent_turn, 202)


async def stream_session(request: Request) -> Response:
    return await _stream(request, "session", request.path_params["session_id"])


async def close_session(request: Request) -> Response:
    gw = _gateway(request)
    session_id = request.path_params["session_id"]
    found = await gw.access.workflow(gw.key(request), "session", session_id)
    if not found.running:
        raise ApiError(409, f"session {session_id!r} has already ended")
    session = get_session(gw.client, session_id)
    try:
        async with asyncio.timeout(WORKER_SECONDS):
            await session.close()
    except WorkflowUpdateFailedError as err:
        why = _refusal(err)
        raise ApiError(409, f"session {session_id!r} cannot close: {why}") from None
    except TimeoutError:
        raise ApiError(504, f"no worker took the close of session {session_id!r}") from None
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:  # it ended since the check above
            raise ApiError(409, f"session {session_id!r} has already ended") from None
        raise
    return _json(SessionRef(session_id=session_id), 202)


async def rewind_session(request: Request) -> Response:
    """Rewind a session the key may reach (its agent's scope); recorded as the key's doing."""
    gw = _gateway(request)
    key = gw.key(request)
    session_id = request.path_params["session_id"]
    body = await read_json(request, RewindSession, gw.max_body)
    found = await gw.access.workflow(key, "session", session_id)
    if not found.running:
        raise ApiError(409, f"session {session_id!r} has ended; it cannot be rewound")
    try:
        # Cancelling a running turn first waits for it to end: a worker's time more.
        async with asyncio.timeout(WORKER_SECONDS * (2 if body.cancel_running else 1)):
            rewind = await get_session(gw.client, session_id).rewind(
                body.to_turn, by=f"gateway key {key.name}", cancel_running=body.cancel_running
            )
    except WorkflowUpdateFailedError as err:
        why = _refusal(err)
        raise ApiError(409, f"session {session_id!r} refused the rewind: {why}") from None
    except SessionClosedError:
        raise ApiError(409, f"session {session_id!r} has ended; it cannot be rewound") from None
    except TimeoutError:
        raise ApiError(504, f"no worker took the rewind of session {session_id!r}") from None
    log.info(
        "key %s rewound session %s from turn %d to turn %d",
        key.name,
        session_id,
        rewind.from_turn,
        rewind.to_turn,
    )
    return _json(rewind)


# -- forks ------------------------------------------------------------------------------------


async def fork_turn(request: Request) -> Response:
    return await _fork(request, "turn", request.path_params["turn_id"])


async def fork_session(request: Request) -> Response:
    return await _fork(request, "session", request.path_params["session_id"])


async def _fork(request: Request, kind: Kind, source: str) -> Response:
    """A fork reads its source and starts into its agent: the key must reach both."""
    gw = _gateway(request)
    key = gw.key(request)
    body = await read_json(request, Fork, gw.max_body)
    found = await gw.access.workflow(key, kind, source)
    agent = body.agent or found.agent
    gw.access.agent(key, agent)
    if body.text is not None and not body.text.strip():
        raise ApiError(422, "text: the message is empty")
    # A model the agent does not allow is refused by the fork's first turn, as any turn's
    # (prepare_turn checks it against the worker's config).
    try:
        async with asyncio.timeout(WORKER_SECONDS):
            forked = await fork(
                gw.client,
                source,
                at=body.at,
                agent=agent,
                model=body.model,
                message=body.text,
                session_id=f"session-{agent}-{uuid.uuid4().hex[:12]}",
                task_queue=gw.task_queue(agent),
                priority=key.priority,
                tenant=key.tenant,
            )
    except ForkError as err:  # a well-formed request the source cannot meet (`at` past its end)
        raise ApiError(409, str(err)) from None
    except WorkflowUpdateFailedError as err:  # the fork refused the message
        why = _refusal(err)
        raise ApiError(409, f"the fork refused the message: {why}") from None
    except TimeoutError:
        raise ApiError(504, f"no worker answered for {kind} {source!r}") from None
    log.info("key %s forked %s %s at %d", key.name, kind, source, body.at)
    fork_of = visibility.fork_of(source, body.at)
    answer = Forked(
        session_id=forked.session_id, fork_of=fork_of, web_ui=gw.web_link(forked.session_id)
    )
    return _json(answer, 201)


# -- streams ----------------------------------------------------------------------------------


async def _stream(request: Request, kind: Any, workflow_id: str) -> Response:
    gw = _gateway(request)
    start = _start(request)
    await gw.access.workflow(gw.key(request), kind, workflow_id, recent=True)
    try:
        events = gw.hub.watch(kind, workflow_id, start)
    except TooManyWatchers:
        raise ApiError(
            503,
            "the gateway serves as many event streams as it may; try again later",
            headers={"retry-after": "5"},
        ) from None
    return EventStream(events)  # type: ignore[return-value]


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)


def _refusal(err: WorkflowUpdateFailedError) -> str:
    """Why a workflow refused an update: its validator's message, else the failure's text."""
    cause = err.cause
    return cause.message if isinstance(cause, ApplicationError) else str(cause or err)
