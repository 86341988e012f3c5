"""CORS for the codec server: only the configured origins (the Web UIs whose pages call it) get
an answer a browser lets through, with credentials allowed (the sign-in cookie)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp

ALLOW_HEADERS = "Authorization, Content-Type, X-Namespace"
ALLOW_METHODS = "POST, OPTIONS"
# A browser keeps a preflight answer this long before asking again.
PREFLIGHT_MAX_AGE = "600"


class Cors:
    """CORS for configured origins only: a refused origin gets 403 and no CORS headers at all
    (Starlette's middleware answers 400 and still sends some), and allowed ones get their exact
    origin back with credentials allowed, as the UI's "include credentials" fetch requires.

    ``/login`` and ``/logout`` are the server's own pages: requests from its own origin (the
    sign-in form) need no CORS; other origins are treated as for ``/decode``."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        origin = request.headers.get("origin")
        own_page = scope["path"] in ("/login", "/logout")
        if own_page and origin in (None, own_origin(request)):
            await self.app(scope, receive, send)
            return
        if origin is not None and origin not in self.allowed:
            response: Response = PlainTextResponse(
                f"origin {origin} may not call this codec server (encryption.codec_server.origins)",
                status_code=403,
            )
            await response(scope, receive, send)
            return
        if request.method == "OPTIONS":
            await _preflight(request, origin)(scope, receive, send)
            return
        if origin is None:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in _cors(origin).items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _preflight(request: Request, origin: str | None) -> Response:
    if origin is None:
        return PlainTextResponse("a CORS preflight needs an Origin header", status_code=400)
    headers = {
        **_cors(origin),
        "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": ALLOW_HEADERS,
        "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
    }
    # Chrome's private network access checks ask before a page reaches a local address.
    if request.headers.get("access-control-request-private-network") == "true":
        headers["Access-Control-Allow-Private-Network"] = "true"
    return Response(status_code=204, headers=headers)


def _cors(origin: str) -> dict[str, str]:
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Credentials": "true",
        "Vary": "Origin",
    }


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}".lower()
