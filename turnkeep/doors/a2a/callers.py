"""Who an A2A request is: the ``Caller`` that ``authorize`` (the gateway's keys) names, or
``Refused``. The routes put the caller in the request's scope; the SDK's request context carries
it to the handler, which audits decisions under its name and lets only a deciding caller decide.
The context is built here, so it carries the caller and never the request's credentials."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from a2a.server.context import ServerCallContext
from a2a.server.routes.common import DefaultServerCallContextBuilder
from starlette.requests import Request

from turnkeep.contract.turn_io import TaskPriority


@dataclass(frozen=True)
class Caller:
    """Who a request is, as ``authorize`` (the gateway's keys) says: the name its decisions are
    audited under (``<name> via a2a``), whether it may decide calls waiting for approval, and
    the priority and tenant of the sessions (contexts) it starts (None: the agent's, and none)."""

    name: str
    decide: bool = True
    priority: TaskPriority | None = None
    tenant: str | None = None


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


def set_caller(request: Request, caller: Caller) -> None:
    """Serve ``request`` as ``caller``: its context will say so."""
    request.scope[_CALLER] = caller


class ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's request context, with the caller and without credentials."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        headers = context.state.get("headers", {})
        for name in _PRIVATE_HEADERS:
            headers.pop(name, None)
        context.state["caller"] = request.scope.get(_CALLER, OPEN)
        return context


def caller_of(context: ServerCallContext) -> Caller:
    """Who the request of ``context`` is (``OPEN`` when the routes were given no ``authorize``)."""
    caller = context.state.get("caller")
    return caller if isinstance(caller, Caller) else OPEN
