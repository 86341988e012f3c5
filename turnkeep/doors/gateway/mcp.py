"""The MCP door (``turnkeep.doors.mcp_server``) inside the gateway: streamable HTTP at ``/mcp``,
behind the gateway's keys.

Each key has a door of its own, built when the app is: an ``McpDoor`` serving exactly the
key's agents, whose decisions are recorded ``gateway key <name> via mcp`` (refused for a key
that may not decide), with its own sessions (``gateway.mcp_scope``) and its own MCP
connections. What a key may not reach is not there to be named: the tool list, the server's
instructions and ``turnkeep_start``'s answer name only the key's agents, and a turn of any
other agent is told as unknown, as the standalone server tells a turn it does not serve. A
turn's agent is read as the API reads it (``Access.agent_of``: the turn's search attribute,
else its start input), whatever queue it runs on.

The guard (``app._Guard``) has identified the key before a request gets here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send
from temporalio.client import Client, WorkflowExecutionDescription

from turnkeep.config.settings import Settings
from turnkeep.doors.gateway import routes
from turnkeep.doors.gateway.access import Access
from turnkeep.doors.gateway.auth import LOOPBACK, ApiKey, KeyRing
from turnkeep.doors.gateway.errors import ApiError
from turnkeep.doors.gateway.limits import read_body
from turnkeep.doors.mcp_server import MCP_PATH, McpDoor

log = logging.getLogger(__name__)

MCP = MCP_PATH


class McpDoors:
    """The ASGI app at ``/mcp``: each request handed to its key's door. Serve it only while
    ``lifespan()`` runs (the gateway app's lifespan enters it): it runs each door's MCP
    session manager, and closes the doors' sessions when it ends."""

    def __init__(
        self,
        client: Client,
        settings: Settings,
        *,
        ring: KeyRing,
        auth: bool,
        task_queue: Callable[[str], str],
        access: Access,
    ) -> None:
        self.max_body = settings.gateway.max_body_bytes
        self.doors: dict[str, McpDoor] = {}
        self._apps: dict[str, Any] = {}
        self._running = False

        async def agent_of(described: WorkflowExecutionDescription) -> str | None:
            return await access.agent_of("turn", described)

        for key in ring.keys if auth else (LOOPBACK,):
            agents = [agent for agent in settings.agents if key.may_use(agent)]
            if not agents:
                continue
            try:
                door = McpDoor(
                    client,
                    settings,
                    agents=agents,
                    scope=settings.gateway.mcp_scope,
                    task_queue=task_queue,
                    agent_of=agent_of,
                    decided_by=f"gateway key {key.name} via mcp",
                    decide=key.decide,
                    priority=key.priority,
                    tenant=key.tenant,
                )
            except ValueError as err:  # an agent named as one of the turnkeep_* tools
                raise ValueError(f"{err} (serve the gateway without MCP: --no-mcp)") from None
            self.doors[key.name] = door
            self._apps[key.name] = door.server.http_app(path=MCP)

    def door(self, key: ApiKey) -> McpDoor | None:
        """The door of ``key`` (None: the key may use none of the gateway's agents)."""
        return self.doors.get(key.name)

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for app in self._apps.values():
                await stack.enter_async_context(app.router.lifespan_context(app))
            self._running = True
            try:
                yield
            finally:
                self._running = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key: ApiKey = scope["state"]["key"]
        app = self._apps.get(key.name)
        try:
            if app is None:
                raise ApiError(403, "this key may use none of the gateway's agents over MCP")
            if not self._running:
                raise ApiError(503, "the gateway's MCP door is not running (its app's lifespan)")
            if scope["method"] == "POST":
                body = await read_body(Request(scope, receive), self.max_body)
                receive = _replay(body, receive)
        except ApiError as err:
            await routes.error_response(err)(scope, receive, send)
            return
        await app(dict(scope), receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives ``body`` once, then the connection's own messages (a streamed
    answer listens there for the client leaving)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
