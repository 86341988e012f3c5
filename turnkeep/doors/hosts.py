"""DNS-rebinding protection for every HTTP door (``turnkeep serve --transport http``, the
gateway: its API, ``/mcp``, A2A and the web page): ``Host`` and ``Origin`` are checked before a
request reaches anything.

A web page open in the user's browser can send requests to a server on the user's machine:
to its address (the page's own origin sent as ``Origin``), or to its own host name rebound to
127.0.0.1 (that name sent as ``Host``). The MCP specification requires servers to validate
``Origin``; every door here is held to it, and to ``Host``, alike:

- ``Origin``, when a request has one (browsers send it; other clients do not), must be the
  request's own origin (a page the server sent, at its ``Host``), one of ``allowed_origins``,
  or, for a request that came in on a loopback address, a loopback origin. Else 403.
- ``Host``, for a request that came in on a loopback address (a server bound to loopback, or
  bound to every address and reached over loopback), must be a loopback name (``localhost``,
  ``127.0.0.1``, ``[::1]``, any port) or one of ``allowed_hosts``. Else 421 Misdirected Request,
  as the MCP SDK answers. On any other address the names a server is reached by are the
  deployment's to say: ``Host`` is checked only when ``allowed_hosts`` names some (the address
  the request came in on is always accepted as its own name).

``allowed_hosts`` entries are ``name`` (any port) or ``name:port``; ``allowed_origins`` entries
are ``scheme://host[:port]``. Both may use ``*`` wildcards (``*`` alone: any).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from turnkeep.support.loopback import is_loopback

log = logging.getLogger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str, *, pattern: bool = False) -> tuple[str, int | None] | None:
    """A ``Host`` header's name (lower case, no brackets) and port; None: not a host. A
    ``pattern`` (an ``allowed_hosts`` entry) may give its port as ``*``: any, as none."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/@?# "):
        return None
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:
        name, port = value, None
    if not name:
        return None
    if port is None or (pattern and port == "*"):
        return name, None
    return (name, int(port)) if port.isdigit() and int(port) <= 65535 else None


def normal_origin(value: str) -> str:
    """``scheme://host:port`` with the scheme's default port written out, in lower case; a
    value that is no such origin comes back lowered as it is, to match nothing but itself."""
    value = value.strip().lower().rstrip("/")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return value
    if not parts.scheme or not parts.hostname or parts.path or parts.query or parts.fragment:
        return value
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = port if port is not None else _DEFAULT_PORTS.get(parts.scheme)
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


class HostOriginGuard:
    """The ASGI middleware every HTTP door is wrapped in (the module's rules): a request with
    a refused ``Host`` or ``Origin`` is answered 421 or 403 and goes no further."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.allowed_hosts = [h.strip().lower() for h in allowed_hosts if h.strip()]
        self.allowed_origins = [o if o == "*" else normal_origin(o) for o in allowed_origins]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        server = scope.get("server")
        address = str(server[0]).lower() if server is not None else None
        local = address is not None and is_loopback(address)
        refused = self._refusal(host, headers.get("origin"), local=local, address=address)
        if refused is not None:
            status, message = refused
            log.debug("refused %s %s: %s", scope.get("method", ""), scope["path"], message)
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})  # policy violation
                return
            await JSONResponse({"error": message}, status_code=status)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(
        self, host: str, origin: str | None, *, local: bool, address: str | None
    ) -> tuple[int, str] | None:
        named = split_host(host)
        if (local or self.allowed_hosts) and not self._host_allowed(named, address):
            return 421, (
                "this server does not answer for that Host (a loopback name or one of its "
                "allowed_hosts)"
            )
        if origin is None or self._origin_allowed(host, origin, local=local):
            return None
        return 403, "requests from that Origin are refused (set allowed_origins to permit it)"

    def _host_allowed(self, named: tuple[str, int | None] | None, address: str | None) -> bool:
        if named is None:
            return False
        name, port = named
        # The address the request was sent to, named as such (a health probe's, say): a
        # rebound request names the attacker's host instead.
        if is_loopback(name) or name == address:
            return True
        for allowed in self.allowed_hosts:
            if allowed == "*":
                return True
            wanted = split_host(allowed, pattern=True)
            if wanted is None:
                continue
            want_name, want_port = wanted
            if fnmatchcase(name, want_name) and (want_port is None or want_port == port):
                return True
        return False

    def _origin_allowed(self, host: str, origin: str, *, local: bool) -> bool:
        given = normal_origin(origin)
        if any(a == "*" or fnmatchcase(given, a) for a in self.allowed_origins):
            return True
        # The request's own origin, on the Origin's scheme: behind a proxy that ends TLS the
        # server sees http where the page was https.
        scheme = given.partition("://")[0]
        if given == normal_origin(f"{scheme}://{host.strip()}"):
            return True
        if not local:
            return False
        try:
            hostname = urlsplit(given).hostname
        except ValueError:
            return False
        return hostname is not None and is_loopback(hostname)
