"""A Temporal remote codec server for turnkeep's encrypted payloads (``turnkeep codec-server``).

It speaks Temporal's codec server protocol, so the Web UI and ``temporal workflow show
--codec-endpoint URL --codec-auth "Bearer TOKEN"`` can show what encrypted payloads hold:

- ``POST /decode`` and ``POST /encode``: body ``{"payloads": [...]}``, each element a
  ``temporal.api.common.v1.Payload`` in protobuf JSON; the answer has the same shape. The
  ``X-Namespace`` header names the namespace (every namespace shares turnkeep's keys). The UI
  adds ``?preserveStorageRefs=true``: external-storage references are not encrypted, so they
  come back untouched either way.
- Every request must be authorised by ``encryption.codec_server.token``: an
  ``Authorization: Bearer <token>`` header (CLI, scripts), or the cookie that ``/login`` sets
  for a browser (the embedded Web UI has no sign-in, so it cannot send an access token). The
  cookie holds a random session id, not the token, that this server process knows for
  ``encryption.codec_server.session_lifetime`` (12 hours by default) or until ``/logout`` ends
  it; it is ``HttpOnly`` (the UI's scripts cannot read it) and ``SameSite=Strict`` (only pages
  on the same site, e.g. the UI on another port of 127.0.0.1, send it).
- It speaks plain HTTP, so it warns when it listens on anything but a loopback address.
- Browsers may call it only from ``encryption.codec_server.origins``: a preflight or request
  with any other ``Origin`` gets 403 and no CORS headers. Allowed origins get exactly their
  origin back with ``Access-Control-Allow-Credentials: true``, which the UI's "include
  cross-origin credentials" setting needs.

``CodecServer`` runs it in the caller's event loop (``turnkeep codec-server``, tests); the
embedded dev server runs one as a detached process beside it (``turnkeep.devserver.codec``), so
the Web UI link keeps decrypting after ``run`` returns.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp
from temporalio.api.common.v1 import Payloads

from turnkeep.config.settings import EncryptionSettings
from turnkeep.payloads.codec import EncryptionCodec, EncryptionError
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.support.durations import describe_duration

ALLOW_HEADERS = "Authorization, Content-Type, X-Namespace"
ALLOW_METHODS = "POST, OPTIONS"
# A browser keeps a preflight answer this long before asking again.
PREFLIGHT_MAX_AGE = "600"
# Decoding a whole history page at once stays far below this; it bounds what one request reads.
MAX_BODY_BYTES = 64 * 1024 * 1024
_SESSION_LABEL = b"turnkeep codec-server session"

log = logging.getLogger(__name__)


class CodecServerError(RuntimeError):
    """The codec server cannot start: no token configured, or its address is taken."""


def require_token(encryption: EncryptionSettings) -> str:
    token = encryption.codec_server.token
    if token is None:
        raise CodecServerError(
            "encryption.codec_server.token is not set. The codec server decrypts payloads for "
            "whoever presents that token, so it will not run without one: set it in "
            "turnkeep.yaml as ${TURNKEEP_CODEC_TOKEN} (make one with `openssl rand -base64 32`)"
        )
    return token.get_secret_value()


class _Sessions:
    """Browser sign-ins: random ids, each valid for ``lifetime`` or until it is closed. Only in
    this process's memory, so restarting the server signs every browser out."""

    def __init__(self, lifetime: timedelta) -> None:
        self.lifetime = lifetime
        self._expiry: dict[str, float] = {}

    def open(self) -> str:
        now = time.monotonic()
        # Forget expired ones here: only someone with the token can make the table grow.
        self._expiry = {s: at for s, at in self._expiry.items() if at > now}
        session = secrets.token_urlsafe(32)
        self._expiry[session] = now + self.lifetime.total_seconds()
        return session

    def valid(self, session: str) -> bool:
        expiry = self._expiry.get(session)
        return expiry is not None and time.monotonic() < expiry

    def close(self, session: str) -> None:
        self._expiry.pop(session, None)


def build_app(
    codec: EncryptionCodec,
    token: str,
    origins: Iterable[str],
    *,
    cookie_name: str,
    session_lifetime: timedelta,
) -> ASGIApp:
    """The codec server's ASGI app: ``/encode``, ``/decode``, ``/login``, ``/logout``."""
    allowed = frozenset(origins)
    sessions = _Sessions(session_lifetime)

    def authorised(request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() == "bearer" and credential:
            return hmac.compare_digest(credential.strip().encode(), token.encode())
        return sessions.valid(request.cookies.get(cookie_name, ""))

    def codec_endpoint(
        transform: Callable[[list[Any]], Awaitable[list[Any]]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not authorised(request):
                return PlainTextResponse(
                    "unauthorised: send Authorization: Bearer <encryption.codec_server.token>, "
                    "or sign in at /login",
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            body = await _read_body(request)
            if body is None:
                return PlainTextResponse(
                    f"request body over {MAX_BODY_BYTES:,} bytes", status_code=413
                )
            payloads = Payloads()
            try:
                json_format.Parse(body, payloads, ignore_unknown_fields=True)
            except (json_format.ParseError, UnicodeDecodeError) as err:
                return PlainTextResponse(
                    f'the body must be {{"payloads": [...]}} in protobuf JSON: {err}',
                    status_code=400,
                )
            try:
                result = await transform(list(payloads.payloads))
            except EncryptionError as err:
                # 4xx: the UI shows the message and does not retry.
                return PlainTextResponse(str(err), status_code=400)
            answer = json_format.MessageToJson(Payloads(payloads=result), indent=None)
            return Response(answer, media_type="application/json")

        return endpoint

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return _login_page(request, allowed)
        fields = parse_qs((await request.body()).decode("utf-8", errors="replace"))
        given = (fields.get("token") or [""])[0].strip()
        if not given or not hmac.compare_digest(given.encode(), token.encode()):
            return _login_page(request, allowed, error="That is not the codec server's token.")
        response = _signed_in_page(request, allowed, session_lifetime)
        response.set_cookie(
            cookie_name,
            sessions.open(),
            max_age=int(session_lifetime.total_seconds()),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(request: Request) -> Response:
        # Ended here, not only deleted from this browser: a copy of the cookie stops working too.
        sessions.close(request.cookies.get(cookie_name, ""))
        response = PlainTextResponse("signed out")
        response.delete_cookie(cookie_name, path="/", httponly=True, samesite="strict")
        return response

    app = Starlette(
        routes=[
            Route("/decode", codec_endpoint(codec.decode), methods=["POST"]),
            Route("/encode", codec_endpoint(codec.encode), methods=["POST"]),
            Route("/login", login, methods=["GET", "POST"]),
            Route("/logout", logout, methods=["POST"]),
        ]
    )
    return _Cors(app, allowed)


async def _read_body(request: Request) -> bytes | None:
    """The body, or None past MAX_BODY_BYTES (counted as it arrives: chunked bodies have no
    Content-Length to check)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class _Cors:
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
        if own_page and origin in (None, _own_origin(request)):
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


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # another host name: it may resolve to anything


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}".lower()


def token_digest(token: str) -> str:
    # For the background server's fingerprint: which token, without recording the token.
    return hmac.new(token.encode(), _SESSION_LABEL, hashlib.sha256).hexdigest()


# -- the sign-in page ----------------------------------------------------------------------

_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:44rem;margin:3rem auto;padding:0 1rem;"
    "line-height:1.5}input{font:inherit;padding:.3rem;width:24rem}button{font:inherit}"
    "code{background:#eee;padding:0 .2rem}.error{color:#b00}"
)


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_STYLE}</style></head>"
        f"<body><h1>{title}</h1>{body}</body></html>",
        status_code=status,
        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"},
    )


def _ui_steps(request: Request, allowed: Iterable[str]) -> str:
    endpoint = html.escape(_own_origin(request))
    uis = ", ".join(f'<a href="{html.escape(o)}">{html.escape(o)}</a>' for o in sorted(allowed))
    return (
        "<p>In the Temporal Web UI"
        + (f" ({uis})" if uis else "")
        + ", open the codec server settings (the <em>Codec Server</em> button in the top bar) "
        "and choose <em>Use my browser setting and ignore Cluster-level setting</em>; set the "
        f"endpoint to <code>{endpoint}</code>, tick <em>Include cross-origin credentials</em> "
        "and apply. The browser then sends this sign-in with the UI's decode requests. Open the "
        "UI on the same host name as this page (127.0.0.1 and localhost are different sites, "
        "and the sign-in only travels within a site).</p>"
    )


def _login_page(request: Request, allowed: Iterable[str], error: str | None = None) -> Response:
    message = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return _page(
        "turnkeep codec server",
        message + "<p>Paste the codec server's token (<code>encryption.codec_server.token</code> "
        "in turnkeep.yaml) to let this browser's Temporal Web UI decrypt turn payloads.</p>"
        '<form method="post" action="/login"><input type="password" name="token" '
        'autocomplete="off" autofocus required> <button type="submit">Sign in</button></form>'
        + _ui_steps(request, allowed),
        status=401 if error else 200,
    )


def _signed_in_page(request: Request, allowed: Iterable[str], lifetime: timedelta) -> HTMLResponse:
    return _page(
        "Signed in",
        f"<p>This browser may now use the codec server for {describe_duration(lifetime)} (until "
        "you sign out with a POST to <code>/logout</code>, or the server restarts).</p>"
        + _ui_steps(request, allowed),
    )


# -- running it ------------------------------------------------------------------------------


class CodecServer:
    """The codec server in the running event loop.

    ``host``/``port`` default to ``encryption.codec_server``; port 0 picks a free one.
    ``origins`` are added to the configured ones (e.g. the embedded Web UI's origin).
    ``start()`` returns the URL (``http://host:port``), which is the codec endpoint to give
    the Web UI (``EmbeddedServer(codec_endpoint=...)``) or ``temporal --codec-endpoint``.
    """

    def __init__(
        self,
        encryption: EncryptionSettings,
        *,
        host: str | None = None,
        port: int | None = None,
        origins: Iterable[str] = (),
    ) -> None:
        config = encryption.codec_server
        self.host = host or config.host
        self.port = config.port if port is None else port
        self.origins = sorted({*config.origins, *origins})
        self._token = require_token(encryption)
        self._session_lifetime = config.session_lifetime
        # The Web UI sends every payload it shows, plaintext ones too (a workflow started from
        # the UI, a plain client's): showing them as they are is all a viewer can do.
        self._codec = EncryptionCodec.from_settings(encryption, allow_plaintext=True)
        self._server: AsgiServer | None = None
        self.url: str | None = None

    async def start(self) -> str:
        if self._server is not None:
            raise CodecServerError("this codec server is already running")
        try:
            sock = bind(self.host, self.port)
        except OSError as err:
            raise CodecServerError(
                f"the codec server cannot listen on {self.host}:{self.port}: {err} "
                "(encryption.codec_server.port; `turnkeep server --stop` stops the one "
                "`turnkeep run` started)"
            ) from None
        port = sock.getsockname()[1]
        app = build_app(
            self._codec,
            self._token,
            self.origins,
            cookie_name=f"turnkeep-codec-{port}",
            session_lifetime=self._session_lifetime,
        )
        self._server = AsgiServer(app, name="codec server", graceful_shutdown=2)
        await self._server.start(sock)
        self.url = http_url(self.host, port)
        if not _loopback(self.host):
            log.warning(
                "the codec server listens on %s over plain HTTP: its token, sign-in cookies and "
                "the payloads it decrypts cross the network unencrypted. Bind it to 127.0.0.1 "
                "(encryption.codec_server.host), or reach it only through a TLS proxy.",
                self.url,
            )
        return self.url

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop()
        self.url = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


# -- beside the background Temporal server ------------------------------------------------
