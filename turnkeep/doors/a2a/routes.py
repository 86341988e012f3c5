"""The Starlette routes serving agents over A2A, and an app of their own: per agent, a JSON-RPC
endpoint (the SDK's dispatcher over a ``SessionRequestHandler``) and its card. Each request is
authorized first, for the card too, and its body is bounded before the SDK reads it; an agent not
served gets an error, nothing started."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from a2a.server.request_handlers.response_helpers import (
    agent_card_to_dict,
    build_error_response,
)
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.types.a2a_pb2 import AgentCard
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from a2a.utils.errors import A2AError, ContentTypeNotSupportedError, InvalidRequestError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message as AsgiMessage
from temporalio.client import Client

from turnkeep.config.settings import Settings
from turnkeep.contract.turn_io import agent_task_queue
from turnkeep.doors.a2a.callers import OPEN, Authorize, ContextBuilder, Refused, set_caller
from turnkeep.doors.a2a.card import agent_card, cached_card
from turnkeep.doors.a2a.handler import SessionRequestHandler
from turnkeep.doors.hosts import HostOriginGuard

MAX_BODY = 1_048_576  # bytes of one JSON-RPC request


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
    built = time.time()  # the cards' Last-Modified: they change only with the settings
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
            handler, context_builder=ContextBuilder(), enable_v0_3_compat=True
        )

    async def rpc(request: Request) -> Response:
        name = request.path_params["agent"]
        try:
            set_caller(request, authorize(request, name) if authorize else OPEN)
        except Refused as refused:
            return _rpc_error(
                InvalidRequestError(message=refused.message), refused.status, refused.headers
            )
        dispatcher = dispatchers.get(name)
        if dispatcher is None:
            return _rpc_error(
                InvalidRequestError(message=f"no agent {_shown(name)} is served here")
            )
        # A body declared as something else than JSON is A2A's unsupported content type
        # (one that declares nothing is read as JSON, as the SDK does).
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type and media_type != "application/json" and not media_type.endswith("+json"):
            return _rpc_error(
                ContentTypeNotSupportedError(
                    message="a JSON-RPC request is sent as Content-Type: application/json"
                )
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
        return cached_card(request, agent_card_to_dict(served), built)

    return [
        Route(f"{prefix}/{{agent}}/", rpc, methods=["POST"]),
        Route(f"{prefix}/{{agent}}{AGENT_CARD_WELL_KNOWN_PATH}", card, methods=["GET"]),
    ]


def a2a_app(
    client: Client,
    settings: Settings,
    agents: Sequence[str] | None = None,
    *,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    **options: Any,
) -> Starlette:
    """``a2a_routes`` as an app of their own (no authentication: loopback or behind a proxy),
    held to ``turnkeep.doors.hosts``' Host and Origin rules, which ``allowed_hosts`` and
    ``allowed_origins`` extend."""
    guard = Middleware(
        HostOriginGuard, allowed_hosts=allowed_hosts, allowed_origins=allowed_origins
    )
    return Starlette(routes=a2a_routes(client, settings, agents, **options), middleware=[guard])


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
