"""The worker's live-text server: its in-flight model calls as server-sent events.

With ``streaming:`` in its config a worker serves ``GET /v1/calls/<call key>`` with
``Authorization: Bearer <token>``. Each attempt of ``llm_step`` opens a stream with a random key
and a random token, and heartbeats its ``LiveAddress`` (url, key, token, call index, attempt)
as its details, which only a client allowed to describe the turn's workflow reads (through the
data converter: with encryption on, encrypted at rest and in transit). Each ``delta`` event
holds a ``temporal.api.common.v1.Payload`` (protobuf, base64) of a ``LiveBatch``, encoded by
the worker's payload converter and codec (``turnkeep.payloads.live_batch``), so with
encryption on the text travels encrypted with the turn's key; ``end`` closes a call's stream.
A wrong or missing token, or an unknown key, gets 403. A stream keeps every delta of its
attempt, so a watcher that connects late gets the text from the start; it is dropped
``LINGER_SECONDS`` after its call ends. The server runs in the worker's event loop, started by
the first streamed model call.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import socket
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from temporalio.converter import DataConverter

from turnkeep.config.settings import StreamingSettings
from turnkeep.contract.live_io import DELTA_EVENT, END_EVENT, PATH_PREFIX, LiveAddress, LiveDelta
from turnkeep.payloads.live_batch import encode_batch
from turnkeep.providers.streaming import LiveCallSink
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.support.sse import encode_event
from turnkeep.worker.health import parse_address

log = logging.getLogger(__name__)

# A finished call's stream stays readable this long, for a watcher that connects late.
LINGER_SECONDS = 30.0


class LiveCall:
    """One attempt of a model call: the ``DeltaSink`` its provider streams into."""

    def __init__(self, address: LiveAddress, converter: DataConverter) -> None:
        self.address = address
        self.converter = converter
        self.deltas: list[LiveDelta] = []
        self.done = False
        self._changed = asyncio.get_running_loop().create_future()

    def text(self, text: str) -> None:
        self._add(LiveDelta(kind="text", text=text))

    def tool_call(self, name: str, call_id: str) -> None:
        self._add(LiveDelta(kind="tool_call", name=name, call_id=call_id))

    def finish(self) -> None:
        self.done = True
        self._wake()

    def changed(self) -> asyncio.Future[None]:
        """Done at the next delta or at the end (await it shielded: it is shared)."""
        return self._changed

    def _add(self, delta: LiveDelta) -> None:
        self.deltas.append(delta)
        self._wake()

    def _wake(self) -> None:
        # One future per wait generation: every watcher of the call wakes, none polls.
        if not self._changed.done():
            self._changed.set_result(None)
            self._changed = asyncio.get_running_loop().create_future()

    async def events(self) -> AsyncIterator[bytes]:
        """The call's server-sent events: its deltas from the first, in batches of what
        arrived since the last, then ``end``."""
        sent = 0
        while True:
            waiting = self.changed()  # before reading the state, so no wake-up is missed
            if sent < len(self.deltas):
                batch = self.deltas[sent:]
                sent += len(batch)
                yield encode_event(DELTA_EVENT, await encode_batch(self.converter, batch))
            elif self.done:
                yield encode_event(END_EVENT)
                return
            else:
                await asyncio.shield(waiting)


class LiveStreams:
    """The worker's in-flight model calls, and the server that serves their text (started by
    the first call, in the running event loop)."""

    def __init__(self, settings: StreamingSettings, *, linger: float = LINGER_SECONDS) -> None:
        self.settings = settings
        self.linger = linger
        self.url: str | None = None
        self._calls: dict[str, LiveCall] = {}
        self._server = AsgiServer(_app(self), name="live-stream server")
        self._starting = asyncio.Lock()
        self._failure: RuntimeError | None = None
        # Compared against when the key is unknown, so a refusal takes the same time.
        self._decoy = secrets.token_urlsafe(24)

    async def open(self, converter: DataConverter, call_index: int, attempt: int) -> LiveCall:
        url = await self._serving()
        address = LiveAddress(
            url=url,
            call_key=secrets.token_urlsafe(16),
            token=secrets.token_urlsafe(24),
            call_index=call_index,
            attempt=attempt,
        )
        call = LiveCall(address, converter)
        self._calls[address.call_key] = call
        return call

    def close(self, call: LiveCallSink) -> None:
        if isinstance(call, LiveCall):
            call.finish()
        loop = asyncio.get_running_loop()
        loop.call_later(self.linger, self._calls.pop, call.address.call_key, None)

    def authorised(self, key: str, header: str | None) -> LiveCall | None:
        call = self._calls.get(key)
        scheme, _, token = (header or "").partition(" ")
        expected = call.address.token if call is not None else self._decoy
        good = hmac.compare_digest(token.encode(), expected.encode())
        return call if call is not None and good and scheme.lower() == "bearer" else None

    async def aclose(self) -> None:
        for call in self._calls.values():
            call.finish()
        await self._server.stop()

    async def _serving(self) -> str:
        async with self._starting:
            if self._failure is not None:
                raise self._failure
            if self.url is None:
                try:
                    self.url = await self._start()
                except OSError as err:  # once: every model call would fail the same way
                    self._failure = RuntimeError(
                        f"the live-stream server cannot listen on {self.settings.listen}: {err}"
                    )
                    raise self._failure from None
            return self.url

    async def _start(self) -> str:
        host, port = parse_address(self.settings.listen)
        port = await self._server.start(bind(host, port))
        if self.settings.advertise:
            url = self.settings.advertise.rstrip("/")
        else:
            shown = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host
            url = http_url(shown, port)
        log.info("live-stream server on %s", url)
        return url


def _app(streams: LiveStreams) -> Starlette:
    """One GET route, an SSE stream per authorised call; JSON refusals."""

    async def call_stream(request: Request) -> Response:
        if request.method != "GET":  # HEAD, which Starlette adds to every GET route
            return _plain(404, "not found")
        key: str = request.path_params["key"]
        call = streams.authorised(key, request.headers.get("authorization"))
        if call is None:
            return _plain(403, "forbidden")
        return StreamingResponse(
            call.events(),
            headers={
                # Given whole: Starlette would add a charset to a text/ media type.
                "content-type": "text/event-stream",
                "cache-control": "no-store",
                "x-accel-buffering": "no",  # proxies: pass each event on at once
            },
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        return _plain(404, "not found")

    app = Starlette(
        # `path`: a key with a slash is an unknown key (403), as any other.
        routes=[Route(f"{PATH_PREFIX}{{key:path}}", call_stream, methods=["GET"])],
        exception_handlers={404: not_found, 405: not_found},
    )
    app.router.redirect_slashes = False
    return app


def _plain(status: int, text: str) -> Response:
    return Response(
        json.dumps({"status": text}).encode(),
        status,
        headers={"cache-control": "no-store"},
        media_type="application/json",
    )
