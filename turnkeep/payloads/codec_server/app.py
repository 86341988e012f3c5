"""The codec server's ASGI app: ``/encode`` and ``/decode`` behind the token or a browser's
sign-in, ``/login`` and ``/logout``, wrapped in CORS for the configured origins."""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp
from temporalio.api.common.v1 import Payloads

from turnkeep.payloads.codec import EncryptionCodec, EncryptionError
from turnkeep.payloads.codec_server.cors import Cors
from turnkeep.payloads.codec_server.login_page import login_page, signed_in_page

# Decoding a whole history page at once stays far below this; it bounds what one request reads.
MAX_BODY_BYTES = 64 * 1024 * 1024


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
            return login_page(request, allowed)
        fields = parse_qs((await request.body()).decode("utf-8", errors="replace"))
        given = (fields.get("token") or [""])[0].strip()
        if not given or not hmac.compare_digest(given.encode(), token.encode()):
            return login_page(request, allowed, error="That is not the codec server's token.")
        response = signed_in_page(request, allowed, session_lifetime)
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
    return Cors(app, allowed)


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
