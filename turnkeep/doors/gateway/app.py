"""``gateway_app``: the HTTP gateway as a Starlette app, for ``turnkeep gateway`` or an
application's own server. Every request under ``/api`` is authenticated (a bearer key),
rate-limited and validated before anything reaches Temporal; every error is
``{"error": "<one line>"}`` with a 4xx (or 5xx) status.

The agents are served over A2A at ``/a2a/<agent>/`` and over MCP (streamable HTTP) at
``/mcp``, behind the same keys. The web page's files, when the package has them
(``turnkeep/doors/web/static``), are served at ``/`` (``index.html``) and ``/static/``; other
apps are mounted with ``mounts``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.config.settings import Settings
from turnkeep.contract.turn_io import agent_task_queue
from turnkeep.doors.gateway import routes
from turnkeep.doors.gateway.access import Access
from turnkeep.doors.gateway.auth import LOOPBACK, ApiKey, KeyRing
from turnkeep.doors.gateway.errors import ApiError
from turnkeep.doors.gateway.fanout import Hub
from turnkeep.doors.gateway.limits import RateLimiter
from turnkeep.doors.gateway.openapi import openapi_document
from turnkeep.doors.gateway.routes import Gateway
from turnkeep.doors.hosts import HostOriginGuard

log = logging.getLogger(__name__)

API = "/api"
# A2A's routes (turnkeep.doors.a2a), behind the same keys as the API.
A2A = "/a2a"
# The agents as MCP tools (turnkeep.doors.gateway.mcp), behind the same keys.
MCP = "/mcp"
GUARDED = (API + "/", A2A + "/", MCP + "/")
# The web page's files, when the package has them.
WEB_STATIC = Path(__file__).resolve().parent.parent / "web" / "static"


class _TurnIdConvertor(PathConvertor):
    """A turn id as the last part of a path: any path (a session's turn id holds a '/') but one
    that ends as another turn route does. ``GET /api/turns/<id>/cancel`` is then that route
    with the wrong method (405, with ``Allow``), not the state of a turn named ``<id>/cancel``."""

    regex = r"(?!.*/(?:cancel|events|fork|approvals(?:/[^/]*)?)$).*"


register_url_convertor("turnkeep_turn", _TurnIdConvertor())

ROUTES: list[tuple[str, Callable[[Request], Any], list[str]]] = [
    ("/agents", routes.list_agents, ["GET"]),
    ("/turns", routes.post_turn, ["POST"]),
    # Turn ids may hold '/' (a session's turn: `<session>/turn-2`): the longer paths first.
    ("/turns/{turn_id:path}/events", routes.stream_turn, ["GET"]),
    ("/turns/{turn_id:path}/cancel", routes.cancel_turn, ["POST"]),
    ("/turns/{turn_id:path}/fork", routes.fork_turn, ["POST"]),
    ("/turns/{turn_id:path}/approvals/{call_id}", routes.decide, ["POST"]),
    ("/turns/{turn_id:path}/approvals", routes.turn_approvals, ["GET"]),
    ("/turns/{turn_id:turnkeep_turn}", routes.get_turn_state, ["GET"]),
    ("/approvals", routes.all_approvals, ["GET"]),
    ("/sessions", routes.post_session, ["POST"]),
    ("/sessions/{session_id}/messages", routes.send_message, ["POST"]),
    ("/sessions/{session_id}/events", routes.stream_session, ["GET"]),
    ("/sessions/{session_id}/close", routes.close_session, ["POST"]),
    ("/sessions/{session_id}/rewind", routes.rewind_session, ["POST"]),
    ("/sessions/{session_id}/fork", routes.fork_session, ["POST"]),
    ("/sessions/{session_id}", routes.get_session_state, ["GET"]),
]

# The query parameters a route reads; the others take none.
_QUERY: dict[Callable[[Request], Any], tuple[str, ...]] = {
    routes.stream_turn: ("after",),
    routes.stream_session: ("after",),
}


def gateway_app(
    client: Client,
    settings: Settings,
    *,
    keys: KeyRing | Iterable[ApiKey] | None = None,
    auth: bool = True,
    task_queue: str | Callable[[str], str] | None = None,
    web_ui: str | None = None,
    web: Path | None = WEB_STATIC,
    mounts: Mapping[str, ASGIApp] | None = None,
    a2a: bool | None = None,
    mcp: bool = True,
) -> Starlette:
    """The gateway over ``client`` for the agents of ``settings`` (its ``gateway:`` block gives
    the keys, CORS origins, allowed hosts and origins, and limits). Every request is first held
    to ``turnkeep.doors.hosts``' Host and Origin rules.

    ``keys``: the keys accepted (default: those of the settings). ``auth=False`` accepts every
    request as a key for every agent that may decide: for a server on loopback only (the
    caller's to ensure). ``task_queue``: where an agent's turns and sessions start (one queue
    for every agent, or a function of the agent; default: the agent's queue on the settings'
    ``task_queue``). ``web_ui``: the Temporal Web UI's base URL, for each turn's link (default:
    ``gateway.web_ui``). ``web``: the web page's directory (none: no page). ``mounts``: more
    apps, by path prefix, served without the API's key check (``app.state.gateway.keys``
    identifies a caller's key for them). ``a2a``: serve each agent over A2A at
    ``/a2a/<agent>/`` behind the same keys (``turnkeep.doors.a2a``; default: when ``a2a-sdk``
    is installed). ``mcp``: serve the agents as MCP tools at ``/mcp`` (streamable HTTP), each
    key its own agents, sessions and right to decide (``turnkeep.doors.gateway.mcp``); the
    app's lifespan runs it (``app.router.lifespan_context(app)`` for a server that runs none).
    Close the app's feeds with ``await app.state.gateway.hub.aclose()``.
    """
    config = settings.gateway
    ring = keys if isinstance(keys, KeyRing) else KeyRing(keys) if keys is not None else None
    if ring is None:
        ring = KeyRing.from_settings(settings)
    if auth and not ring.keys:
        raise ValueError(
            "the gateway has no API keys: add some under gateway.keys (or gateway.keys_file)"
        )
    if isinstance(task_queue, str):
        queue = task_queue
        queue_of: Callable[[str], str] = lambda _agent: queue  # noqa: E731
    elif task_queue is None:
        queue_of = lambda agent: agent_task_queue(settings.task_queue, agent)  # noqa: E731
    else:
        queue_of = task_queue
    gateway = Gateway(
        client=client,
        settings=settings,
        hub=Hub(client, buffer=config.watcher_buffer, max_watchers=config.max_watchers),
        access=Access(client, settings),
        task_queue=queue_of,
        keys=ring,
        web_ui=web_ui or config.web_ui,
    )
    api = [
        Route(path, routes.query_checked(endpoint, *_QUERY.get(endpoint, ())), methods=methods)
        for path, endpoint, methods in ROUTES
    ]
    document = openapi_document()

    async def openapi(_request: Request) -> Response:
        return JSONResponse(document)

    app_routes: list[BaseRoute] = [
        Mount(API, routes=api),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    if a2a is not False:
        app_routes.extend(
            _a2a_routes(client, settings, queue_of, required=a2a is True, bearer=auth)
        )
    doors = None
    if mcp:
        from turnkeep.doors.gateway.mcp import McpDoors

        doors = McpDoors(
            client, settings, ring=ring, auth=auth, task_queue=queue_of, access=gateway.access
        )
        app_routes.append(Route(MCP, endpoint=doors))
    for prefix, mounted in (mounts or {}).items():
        app_routes.append(Mount(prefix, app=mounted))
    if web is not None and (web / "index.html").is_file():
        index = web / "index.html"

        async def page(_request: Request) -> Response:
            return FileResponse(index, headers={"cache-control": "no-cache"})

        app_routes.append(Route("/", page, methods=["GET"]))
        app_routes.append(Mount("/static", app=StaticFiles(directory=web), name="static"))

    middleware = [
        Middleware(
            _Guard,
            ring=ring,
            auth=auth,
            limiter=RateLimiter(config.rate_limit.per_second, config.rate_limit.burst),
        )
    ]
    if config.cors_origins:
        # Before the keys: a browser's preflight is answered before any key is asked for.
        middleware.insert(
            0,
            Middleware(
                CORSMiddleware,
                allow_origins=config.cors_origins,
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type", "last-event-id"],
                max_age=600,
            ),
        )
    # Outermost, for every path (the page, the API, A2A, /mcp): a request for another Host,
    # or from a page the gateway does not know, goes no further (turnkeep.doors.hosts).
    middleware.insert(
        0,
        Middleware(
            HostOriginGuard,
            allowed_hosts=config.allowed_hosts,
            allowed_origins=[*config.allowed_origins, *config.cors_origins],
        ),
    )

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if doors is None:
            yield
            return
        async with doors.lifespan():
            yield

    app = Starlette(
        routes=app_routes,
        middleware=middleware,
        exception_handlers=_HANDLERS,
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    app.state.mcp = doors
    return app


async def _api_error(_request: Request, err: ApiError) -> Response:
    return routes.error_response(err)


_REASONS = {404: "no such path", 405: "method not allowed on this path"}


async def _http_error(request: Request, err: HTTPException) -> Response:
    message = _REASONS.get(err.status_code, err.detail or "bad request")
    if err.status_code in _REASONS:
        message = f"{message}: {request.method} {request.url.path}"
    return JSONResponse({"error": message}, status_code=err.status_code, headers=err.headers)


async def _temporal_error(request: Request, err: RPCError) -> Response:
    log.warning("%s %s: Temporal answered %s", request.method, request.url.path, err.status.name)
    return JSONResponse(
        {"error": f"Temporal did not answer the request ({err.status.name.lower()})"},
        status_code=503 if err.status == RPCStatusCode.UNAVAILABLE else 502,
    )


# Each handler takes the exception type it is registered for (Starlette's types say Exception).
_HANDLERS: dict[Any, Any] = {
    ApiError: _api_error,
    HTTPException: _http_error,
    RPCError: _temporal_error,
}


def _a2a_routes(
    client: Client,
    settings: Settings,
    queue_of: Callable[[str], str],
    *,
    required: bool,
    bearer: bool,
) -> list[BaseRoute]:
    """The A2A routes, each request's caller its key (the guard has identified it): scoped to
    agents, allowed to decide or not, its sessions at the key's priority and tenant. None
    without ``a2a-sdk``, unless ``required``. The cards ask for a bearer key only when the
    gateway does (``bearer``)."""
    try:
        from turnkeep.doors.a2a import Caller, Refused, a2a_routes
    except ImportError:
        if required:
            raise
        return []

    def authorize(request: Request, agent: str) -> Caller:
        key: ApiKey = request.scope["state"]["key"]
        if not key.may_use(agent):
            raise Refused(403, f"this key may not use agent {agent!r}")
        # A2A asks no priority: the key's is the most a context it starts may have.
        return Caller(
            name=f"gateway key {key.name}",
            decide=key.decide,
            priority=key.priority_of(None),
            tenant=key.tenant,
        )

    return a2a_routes(
        client,
        settings,
        prefix=A2A,
        task_queue=queue_of,
        bearer=bearer,
        authorize=authorize,
        max_body=settings.gateway.max_body_bytes,
    )


class _Guard:
    """Authentication and rate limits for ``/api``, ``/a2a`` and ``/mcp``, before any route: a
    request without a valid key never reaches Temporal."""

    def __init__(self, app: ASGIApp, *, ring: KeyRing, auth: bool, limiter: RateLimiter) -> None:
        self.app = app
        self.ring = ring
        self.auth = auth
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if not (path == MCP or path.startswith(GUARDED)):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        try:
            key = self._key(request)
            caller = f"key:{key.name}" if key is not None else f"addr:{_address(request)}"
            wait = self.limiter.wait_for(caller)
            if wait > 0:
                raise ApiError(
                    429,
                    "too many requests; slow down",
                    headers={"retry-after": str(max(1, round(wait)))},
                )
            if key is None:
                raise ApiError(
                    401,
                    "a valid API key is required: Authorization: Bearer <key>",
                    headers={"www-authenticate": "Bearer"},
                )
        except ApiError as err:
            await routes.error_response(err)(scope, receive, send)
            return
        scope.setdefault("state", {})["key"] = key
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as err:
            # Answered here, not re-raised to the server: its traceback would log what the
            # exception quotes, which may be what the request carried.
            log.error("%s %s failed: %s", scope["method"], scope["path"], type(err).__name__)
            if not started:
                failed = ApiError(500, f"the gateway failed: {type(err).__name__}")
                await routes.error_response(failed)(scope, receive, send)

    def _key(self, request: Request) -> ApiKey | None:
        if not self.auth:
            return LOOPBACK
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.ring.identify(token.strip())


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"
