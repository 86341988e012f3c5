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
the Web UI link keeps decrypting after ``run`` returns. The ASGI app is in ``app``, its CORS in
``cors``, the sign-in pages in ``login_page``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable

from turnkeep.config.settings import EncryptionSettings
from turnkeep.payloads.codec import EncryptionCodec
from turnkeep.payloads.codec_server.app import build_app
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.support.lifecycle import AsyncStartStop
from turnkeep.support.loopback import is_loopback

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


def token_digest(token: str) -> str:
    # For the background server's fingerprint: which token, without recording the token.
    return hmac.new(token.encode(), _SESSION_LABEL, hashlib.sha256).hexdigest()


class CodecServer(AsyncStartStop[str]):
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
        if not is_loopback(self.host):
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
