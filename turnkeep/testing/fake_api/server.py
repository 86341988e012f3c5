"""The fake API's server: its routes and mounts, a thread of its own, and each request answered
from the scripts."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnkeep.support.lifecycle import StartStop
from turnkeep.testing.fake_api import anthropic, openai
from turnkeep.testing.fake_api.http1 import (
    hold_unless_hung_up,
    read_request,
    send,
    sleep_unless_hung_up,
    stream,
)
from turnkeep.testing.fake_api.limits import (
    STATS_PATH,
    LimitStats,
    LimitWindow,
    ProviderLimits,
    request_tokens,
)
from turnkeep.testing.fake_api.scripts import Recorded, Scripts
from turnkeep.testing.fake_api.steps import Answer, Api, Delay, Drop, Failure, Raw, Step
from turnkeep.testing.fake_api.wire import WireFormat, cut

FORMATS: dict[Api, WireFormat] = {"anthropic": anthropic, "openai": openai}
ROUTES: dict[str, Api] = {wire.ROUTE: api for api, wire in FORMATS.items()}


@dataclass(frozen=True)
class Mount:
    prefix: str
    api: Api
    auth: tuple[str, str] | None  # (lower-case header name, exact value)


class FakeModelApi(Scripts, StartStop["FakeModelApi"]):
    """The fake Anthropic and OpenAI APIs on one loopback port, answering from scripts, within
    a provider's rate ``limits`` if given (one API key's, for every model and both APIs)."""

    def __init__(
        self,
        *,
        default: Step | None = None,
        respond: Callable[[Recorded], Step | None] | None = None,
        limits: ProviderLimits | None = None,
    ) -> None:
        super().__init__(default=default, respond=respond)
        self._window = LimitWindow(limits)
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._mounts: list[Mount] = []
        self._mounts_lock = threading.Lock()
        self.port = 0

    @property
    def base_url_anthropic(self) -> str:
        return f"http://127.0.0.1:{self.port}"  # the SDK appends /v1/messages

    @property
    def base_url_openai(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"  # the SDK appends /chat/completions

    def mount(
        self, prefix: str, *, api: Api = "openai", auth: tuple[str, str] | None = None
    ) -> str:
        """Serve ``api`` at any path under ``prefix`` that ends as its route does
        (``/chat/completions``, ``/messages``), answering from the same script (the longest
        prefix wins; mounting one again replaces it). With ``auth``
        (header name, exact value), a request without it gets a 401 in the API's error shape
        and uses up no step (it is still recorded). Returns the base URL of ``prefix``."""
        mount = Mount(prefix, api, (auth[0].lower(), auth[1]) if auth else None)
        with self._mounts_lock:  # mounting a prefix again replaces it
            self._mounts = [m for m in self._mounts if (m.prefix, m.api) != (prefix, api)]
            self._mounts.append(mount)
        return f"http://127.0.0.1:{self.port}{prefix.rstrip('/')}"

    def limit(self, limits: ProviderLimits | None) -> None:
        """Enforce ``limits`` (None: none) from now on, counting afresh: a request beyond them
        gets a 429 in its API's shape with ``retry-after`` (and OpenAI's ``retry-after-ms``),
        the seconds until the window has room for it, and uses up no script step (the request
        is still recorded)."""
        self._window.set_limits(limits)

    @property
    def limits(self) -> ProviderLimits | None:
        return self._window.limits

    def limit_stats(self) -> LimitStats:
        """Requests answered and refused, tokens, and the peaks in any one window, since the
        start, the last ``limit`` or ``reset`` (over HTTP: ``GET /fake/stats``)."""
        return self._window.stats()

    def reset(self) -> None:
        """Forget every script and recorded request and count afresh (mounts and limits
        stay)."""
        super().reset()
        self._window.reset()

    def start(self) -> FakeModelApi:
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name="fake-model-api", daemon=True
        )
        self._thread.start()
        if not ready.wait(10) or failure:
            raise RuntimeError(f"fake model API did not start: {failure}")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = self._thread = None

    # --- the server thread --------------------------------------------------------------------

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
        except BaseException as err:
            failure.append(err)
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        # Hanging up (rather than cancelling the handlers) lets each one end on its own EOF;
        # Python 3.11's start_server logs a traceback for every cancelled handler.
        for writer in self._connections.values():
            writer.close()
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            # HTTP/1.1 keep-alive: the SDKs reuse connections, so serve requests until EOF.
            while (request := await read_request(reader)) is not None:
                if not await self._answer(*request, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            del self._connections[task]
            writer.close()

    async def _answer(
        self,
        path: str,
        headers: dict[str, str],
        body: Any,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Serve one request; False when the connection is to be closed."""
        route = path.split("?")[0]
        if route == STATS_PATH:
            await send(writer, 200, self._window.stats().to_json())
            return True
        api = ROUTES.get(route)
        mount = None if api is not None else self._mounted(route)
        api = mount.api if mount is not None else api
        if api is None:
            await send(writer, 404, {"error": {"message": f"no route {path}"}})
            return True
        authorized = (
            mount is None or mount.auth is None or headers.get(mount.auth[0]) == mount.auth[1]
        )
        recorded = Recorded(api, path, headers, body, time.monotonic())
        step, source = self.take_from(recorded, authorized=authorized)
        step = sized(step, body)
        wire = FORMATS[api]
        model = body.get("model", "fake-model") if isinstance(body, dict) else "fake-model"
        refusal = self._window.admit(tokens_of(step), recorded.at)
        if refusal is not None:
            self.put_back(step, source)
            step = wire.rate_limited(refusal, model)
        while isinstance(step, Delay):
            if not await sleep_unless_hung_up(step.seconds, reader):
                return False
            step = step.then
        id_header = {wire.REQUEST_ID_HEADER: f"req_fake_{next(self._ids)}"}
        match step:
            case Drop():
                return False
            case Answer() if isinstance(body, dict) and body.get("stream"):
                if step.streamed_as != "json":
                    events = cut(wire.events(step, model, body), step.streamed_as, wire.is_stop)
                    return await stream(writer, reader, step, events, id_header)
                # The whole answer to a streamed request: held as its last chunk would be.
                if step.hold is not None and not await hold_unless_hung_up(step.hold, reader):
                    return False
                await send(writer, 200, wire.answer_body(step, model), id_header)
            case Answer():
                await send(writer, 200, wire.answer_body(step, model), id_header)
            case Failure():
                await send(
                    writer, step.status, wire.error_body(step), {**id_header, **step.headers}
                )
            case Raw():
                await send(writer, step.status, step.body, step.headers, step.content_type)
        return True

    def _mounted(self, route: str) -> Mount | None:
        with self._mounts_lock:  # the longest prefix wins
            mounts = sorted(self._mounts, key=lambda m: len(m.prefix), reverse=True)
        for mount in mounts:
            if route.startswith(mount.prefix) and route.endswith(FORMATS[mount.api].ENDING):
                return mount
        return None


def sized(step: Step, body: Any) -> Step:
    """``step`` with a ``Tokens(sized=True)`` usage made the request's own size."""
    match step:
        case Delay():
            return Delay(step.seconds, sized(step.then, body))
        case Answer() if step.usage.sized:
            usage = dataclasses.replace(step.usage, input=request_tokens(body), sized=False)
            return dataclasses.replace(step, usage=usage)
    return step


def tokens_of(step: Step) -> int:
    """The tokens the answer to a request reports (none for an error or a hang-up)."""
    while isinstance(step, Delay):
        step = step.then
    return step.usage.total if isinstance(step, Answer) else 0
