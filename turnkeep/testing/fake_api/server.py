"""A fake Anthropic / OpenAI API over real HTTP on 127.0.0.1, for tests and benchmarks.

It speaks ``POST /v1/messages`` (Anthropic) and ``POST /v1/chat/completions`` (OpenAI), both
non-streaming and (a request with ``stream``) as server-sent events the way the real APIs
stream, answering from a script of steps, one per request, in order, per API (or per model:
see below)::

    with FakeModelApi() as fake:
        fake.script(
            Reply.error(429, "slow down", headers={"retry-after": "2"}),
            Reply.tool_calls(("call_1", "srv__tool", {"a": 1})),
            Reply.delay(0.5, then=Reply.text("done", usage=Tokens(input=100, output=7))),
        )
        client = AsyncAnthropic(api_key="k", base_url=fake.base_url_anthropic)
        ...
        assert fake.requests[0].body["messages"] == [...]

It records every request (JSON body, headers, arrival time) for assertions.

A script of its own for one model id (the ``model`` a request names) answers that model's
requests, whichever API they come by, so agents with different fake models each follow their
own script in one worker (``FakeModel`` builds on it)::

    fake.script(Reply.text("from A"), model="agent-a")

A streamed answer can misbehave as some OpenAI-compatible servers and proxies do
(``streamed_as``): answer with the whole non-streamed body (``"json"``), or end the stream
cleanly without its closing event (``"no_done"``: no ``[DONE]`` / ``message_stop``) or without
its stop reason either (``"no_stop"``: no ``finish_reason`` chunk / ``message_delta``)::

    fake.script(Reply.text("whole", streamed_as="json"))

``refuse_field`` plays a server that does not know a request field (an OpenAI-compatible one
refusing ``stream_options``, say): every request carrying it gets a 400 naming the field::

    fake.refuse_field("stream_options")

``mount`` serves an API under a provider's own path too, optionally only to requests carrying
its auth header (others get a 401 in the API's shape, without using up a script step)::

    base_url = fake.mount("/openai/deployments/", auth=("api-key", KEY))

It is a tiny HTTP/1.1 server on asyncio streams rather than an ASGI app, because it must be able
to hang up without answering (``Reply.drop()``), which ASGI servers turn into a 500. It runs on
its own event loop in a daemon thread, so it works the same under any test loop scope, and a
``Reply.delay`` ends early when the client gives up waiting, so shutdown never waits on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

Api = Literal["anthropic", "openai"]
# How a streamed request is answered: as the API streams ("sse"), or misbehaving (see above).
StreamedAs = Literal["sse", "json", "no_done", "no_stop"]
APIS: tuple[Api, ...] = ("anthropic", "openai")
ROUTES: dict[str, Api] = {"/v1/messages": "anthropic", "/v1/chat/completions": "openai"}
# What a mounted path ends with, per API.
ROUTE_ENDINGS: dict[Api, str] = {"anthropic": "/messages", "openai": "/chat/completions"}


@dataclass(frozen=True)
class Tokens:
    input: int = 10
    output: int = 5
    cache_read: int = 0
    cache_write: int = 0


@dataclass(frozen=True)
class Answer:
    text: str | None = None
    # (call id, tool name, arguments); arguments given as a str are sent verbatim (bad JSON).
    calls: tuple[tuple[str, str, Any], ...] = ()
    thinking: str | None = None  # an Anthropic thinking block / OpenAI-compatible reasoning
    stop: str | None = None  # the API's own stop_reason / finish_reason, if not the natural one
    usage: Tokens = Tokens()
    # A streamed answer (the request asked for `stream`): seconds between its chunks, and an
    # event its last text chunk waits for (a test sets it once it has seen the first deltas);
    # answered whole (`streamed_as="json"`), it waits for that event before it is sent.
    chunk_delay: float = 0.0
    hold: threading.Event | None = None
    # time.monotonic() as each text chunk is sent, appended here (benchmarks).
    sent: list[float] | None = None
    streamed_as: StreamedAs = "sse"


@dataclass(frozen=True)
class Failure:
    status: int
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    code: str | None = None  # OpenAI's error.code; Anthropic's error.type


@dataclass(frozen=True)
class Raw:
    status: int
    body: Any  # a str is sent verbatim, anything else as JSON
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "application/json"


@dataclass(frozen=True)
class Delay:
    seconds: float
    then: Step


@dataclass(frozen=True)
class Drop:
    pass


Step = Answer | Failure | Raw | Delay | Drop


@dataclass(frozen=True)
class Mount:
    prefix: str
    api: Api
    auth: tuple[str, str] | None  # (lower-case header name, exact value)


class Reply:
    """Constructors for script steps."""

    @staticmethod
    def text(
        text: str,
        *,
        thinking: str | None = None,
        stop: str | None = None,
        usage: Tokens = Tokens(),
        chunk_delay: float = 0.0,
        hold: threading.Event | None = None,
        streamed_as: StreamedAs = "sse",
    ) -> Answer:
        return Answer(
            text=text,
            thinking=thinking,
            stop=stop,
            usage=usage,
            chunk_delay=chunk_delay,
            hold=hold,
            streamed_as=streamed_as,
        )

    @staticmethod
    def tool_calls(
        *calls: tuple[str, str, Any],
        text: str | None = None,
        stop: str | None = None,
        usage: Tokens = Tokens(),
        streamed_as: StreamedAs = "sse",
    ) -> Answer:
        return Answer(text=text, calls=calls, stop=stop, usage=usage, streamed_as=streamed_as)

    @staticmethod
    def error(
        status: int,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        code: str | None = None,
    ) -> Failure:
        return Failure(status, message, dict(headers or {}), code)

    @staticmethod
    def raw(
        status: int,
        body: Any,
        *,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Raw:
        return Raw(status, body, dict(headers or {}), content_type)

    @staticmethod
    def delay(seconds: float, then: Step) -> Delay:
        return Delay(seconds, then)

    @staticmethod
    def drop() -> Drop:
        return Drop()


@dataclass(frozen=True)
class Recorded:
    api: Api
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # parsed JSON, or the raw text if it was not JSON
    at: float  # time.monotonic() on arrival

    @property
    def model(self) -> str | None:
        """The model id the request named."""
        model = self.body.get("model") if isinstance(self.body, dict) else None
        return model if isinstance(model, str) else None


class FakeModelApi:
    """The fake Anthropic and OpenAI APIs on one loopback port, answering from scripts."""

    def __init__(
        self,
        *,
        default: Step | None = None,
        respond: Callable[[Recorded], Step | None] | None = None,
    ) -> None:
        """``default`` answers once a script runs out (benchmarks); without it such a request
        gets a 400 saying the script is exhausted, which no provider adapter retries.
        ``respond``, if given, answers such a request first, from the request itself (a
        scripted system under test); its None falls through to ``default``."""
        self.default = default
        self.respond = respond
        self._scripts: dict[Api, deque[Step]] = {api: deque() for api in APIS}
        self._model_scripts: dict[str, deque[Step]] = {}
        self._requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._mounts: list[Mount] = []
        self._refused_fields: dict[str, int] = {}
        self.port = 0

    # --- public API -------------------------------------------------------------------------

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
        with self._lock:  # mounting a prefix again replaces it
            self._mounts = [m for m in self._mounts if (m.prefix, m.api) != (prefix, api)]
            self._mounts.append(mount)
        return f"http://127.0.0.1:{self.port}{prefix.rstrip('/')}"

    def refuse_field(self, name: str, *, status: int = 400) -> None:
        """Answer every request whose JSON body has the top-level field ``name`` with a
        ``status`` error naming it, as a server that does not know the field does, using up no
        script step (the request is still recorded). ``reset`` forgets it."""
        with self._lock:
            self._refused_fields[name] = status

    def script(self, *steps: Step, api: Api | None = None, model: str | None = None) -> None:
        """Append steps to the script of one API, or of both (each serves its own copy); with
        ``model``, to that model id's own script instead, which answers its requests on
        either API from then on."""
        if model is not None and api is not None:
            raise ValueError("a model's script serves both APIs: give `api` or `model`")
        with self._lock:
            if model is not None:
                self._model_scripts.setdefault(model, deque()).extend(steps)
                return
            for name in (api,) if api else APIS:
                self._scripts[name].extend(steps)

    def pending(self, api: Api | None = None, *, model: str | None = None) -> int:
        """Steps not yet served: of ``api``'s script, or of ``model``'s."""
        with self._lock:
            if model is not None:
                return len(self._model_scripts.get(model, ()))
            if api is None:
                raise ValueError("name the `api` or the `model` whose script to count")
            return len(self._scripts[api])

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def requests_for(self, api: Api) -> list[Recorded]:
        return [r for r in self.requests if r.api == api]

    def requests_for_model(self, model: str) -> list[Recorded]:
        return [r for r in self.requests if r.model == model]

    def reset(self) -> None:
        """Forget every script and recorded request (mounts stay)."""
        with self._lock:
            for queue in self._scripts.values():
                queue.clear()
            self._model_scripts.clear()
            self._requests.clear()
            self._refused_fields.clear()

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

    def __enter__(self) -> FakeModelApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
        api = ROUTES.get(route)
        mount = None if api is not None else self._mounted(route)
        api = mount.api if mount is not None else api
        if api is None:
            await send(writer, 404, {"error": {"message": f"no route {path}"}})
            return True
        refused = (
            mount is not None
            and mount.auth is not None
            and headers.get(mount.auth[0]) != mount.auth[1]
        )
        recorded = Recorded(api, path, headers, body, time.monotonic())
        with self._lock:
            self._requests.append(recorded)
            own = self._model_scripts.get(recorded.model) if recorded.model else None
            script = own if own is not None else self._scripts[api]
            unknown = [f for f in self._refused_fields if isinstance(body, dict) and f in body]
            step: Step | None
            if refused:
                # Never echoing what was sent: it could be a key.
                step = Failure(401, "Invalid authentication credentials", code="invalid_api_key")
            elif unknown:
                # The wording of OpenAI's own API for a field it does not take.
                status = self._refused_fields[unknown[0]]
                step = Failure(status, f"Unrecognized request argument supplied: {unknown[0]}")
            else:
                step = script.popleft() if script else None
        if step is None and not refused and not unknown and self.respond is not None:
            step = self.respond(recorded)
        step = step if step is not None else self.default
        if step is None:
            whose = f"model {recorded.model!r}" if own is not None else api
            step = Failure(400, f"fake model API: the {whose} script is exhausted")
        while isinstance(step, Delay):
            if not await sleep_unless_hung_up(step.seconds, reader):
                return False
            step = step.then
        model = body.get("model", "fake-model") if isinstance(body, dict) else "fake-model"
        request_id = f"req_fake_{next(self._ids)}"
        id_header = {"request-id" if api == "anthropic" else "x-request-id": request_id}
        match step:
            case Drop():
                return False
            case Answer() if isinstance(body, dict) and body.get("stream"):
                if step.streamed_as != "json":
                    events = (
                        anthropic_events(step, model)
                        if api == "anthropic"
                        else openai_chunks(step, model, usage=bool(body.get("stream_options")))
                    )
                    events = cut(events, step.streamed_as)
                    return await stream(writer, reader, step, events, id_header)
                # The whole answer to a streamed request: held as its last chunk would be.
                if step.hold is not None and not await hold_unless_hung_up(step.hold, reader):
                    return False
                await send(writer, 200, whole_answer(api, step, model), id_header)
            case Answer():
                await send(writer, 200, whole_answer(api, step, model), id_header)
            case Failure():
                payload = anthropic_error(step) if api == "anthropic" else openai_error(step)
                await send(writer, step.status, payload, {**id_header, **step.headers})
            case Raw():
                await send(writer, step.status, step.body, step.headers, step.content_type)
        return True

    def _mounted(self, route: str) -> Mount | None:
        with self._lock:  # the longest prefix wins
            mounts = sorted(self._mounts, key=lambda m: len(m.prefix), reverse=True)
        for mount in mounts:
            if route.startswith(mount.prefix) and route.endswith(ROUTE_ENDINGS[mount.api]):
                return mount
        return None


# --- HTTP ------------------------------------------------------------------------------------


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], Any] | None:
    line = await reader.readline()
    if not line.strip():
        return None
    _method, path, _version = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raw = await reader.readexactly(int(headers.get("content-length", "0")))
    text = raw.decode("utf-8", errors="replace")
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = text
    return path, headers, body


async def sleep_unless_hung_up(seconds: float, reader: asyncio.StreamReader) -> bool:
    """Sleep; False as soon as the client closes the connection (it timed out) instead."""
    hangup = asyncio.ensure_future(reader.read(1))
    try:
        done, _ = await asyncio.wait({hangup}, timeout=seconds)
        return not done
    finally:
        hangup.cancel()
        # Awaited out, so the connection's next read does not find this one still waiting.
        await asyncio.gather(hangup, return_exceptions=True)


async def hold_unless_hung_up(hold: threading.Event, reader: asyncio.StreamReader) -> bool:
    """Wait (a bounded two minutes, for a test that failed) until ``hold`` is set; False as soon
    as the client closes the connection instead."""
    for _ in range(6000):
        if hold.is_set():
            break
        if not await sleep_unless_hung_up(0.02, reader):
            return False
    return True


async def send(
    writer: asyncio.StreamWriter,
    status: int,
    body: Any,
    headers: Mapping[str, str] | None = None,
    content_type: str = "application/json",
) -> None:
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Overloaded" if status == 529 else "Unknown"
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"content-type: {content_type}",
        f"content-length: {len(data)}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
    await writer.drain()


# A streamed event: (SSE event name or None, JSON body or the literal data, is a text chunk).
Event = tuple[str | None, Any, bool]


async def stream(
    writer: asyncio.StreamWriter,
    reader: asyncio.StreamReader,
    answer: Answer,
    events: list[Event],
    headers: Mapping[str, str],
) -> bool:
    """Send ``events`` as server-sent events (chunked), ``answer.chunk_delay`` apart, the last
    text chunk only once ``answer.hold`` is set; False when the client hung up meanwhile."""
    lines = [
        "HTTP/1.1 200 OK",
        "content-type: text/event-stream",
        "transfer-encoding: chunked",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    last_text = max((i for i, (_, _, text) in enumerate(events) if text), default=-1)
    # One read for the whole stream notices a hang-up (a client that gave up, or died); it is
    # awaited out before the connection's next request is read.
    hangup = asyncio.ensure_future(reader.read(1))

    async def wait(seconds: float) -> bool:
        done, _ = await asyncio.wait({hangup}, timeout=seconds)
        return not done

    try:
        for index, (name, body, _) in enumerate(events):
            if index and answer.chunk_delay and not await wait(answer.chunk_delay):
                return False
            if index == last_text and answer.hold is not None:
                for _ in range(6000):  # a bounded wait (two minutes), for a test that failed
                    if answer.hold.is_set():
                        break
                    if not await wait(0.02):
                        return False
            data = body if isinstance(body, str) else json.dumps(body)
            event = (f"event: {name}\n" if name else "") + f"data: {data}\n\n"
            chunk = event.encode()
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
            if answer.sent is not None and events[index][2]:
                answer.sent.append(time.monotonic())
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
    finally:
        hangup.cancel()
        with contextlib.suppress(BaseException):
            await hangup


def cut(events: list[Event], streamed_as: StreamedAs) -> list[Event]:
    """A stream without its closing event ("no_done"), or without its stop reason as well
    ("no_stop"): the Messages API's ``message_delta``, Chat Completions' ``finish_reason``
    chunk (and the usage chunk and ``[DONE]`` after it)."""
    if streamed_as == "no_done":
        return events[:-1]
    if streamed_as != "no_stop":
        return events
    stop = next(i for i, event in enumerate(events) if is_stop(event))
    return events[:stop]


def is_stop(event: Event) -> bool:
    name, body, _ = event
    if name == "message_delta":
        return True
    choices = body.get("choices") if isinstance(body, dict) else None
    return (
        isinstance(choices, list) and bool(choices) and choices[0].get("finish_reason") is not None
    )


def text_pieces(text: str) -> list[str]:
    """A text as a model streams it: word by word, each with the spaces after it."""
    return re.findall(r"\s*\S+\s*", text) or [text]


def anthropic_events(answer: Answer, model: str) -> list[Event]:
    """The Messages API's stream of ``anthropic_answer``: the same message, in events."""
    whole = anthropic_answer(answer, model)
    start = {**whole, "content": [], "stop_reason": None}
    start["usage"] = {**whole["usage"], "output_tokens": 1}
    events: list[Event] = [("message_start", {"type": "message_start", "message": start}, False)]
    for index, block in enumerate(whole["content"]):

        def delta(body: dict[str, Any], text: bool = False, i: int = index) -> Event:
            return (
                "content_block_delta",
                {"type": "content_block_delta", "index": i, "delta": body},
                text,
            )

        kind = block["type"]
        empty = {
            "text": {"type": "text", "text": ""},
            "thinking": {"type": "thinking", "thinking": "", "signature": ""},
        }
        first = empty.get(kind, {**block, "input": {}})
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": first},
                False,
            )
        )
        if kind == "text":
            events += [
                delta({"type": "text_delta", "text": p}, True) for p in text_pieces(block["text"])
            ]
        elif kind == "thinking":
            events.append(delta({"type": "thinking_delta", "thinking": block["thinking"]}))
            events.append(delta({"type": "signature_delta", "signature": block["signature"]}))
        else:
            events.append(
                delta({"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}, False))
    stop = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": whole["usage"]["output_tokens"]}
    events.append(
        ("message_delta", {"type": "message_delta", "delta": stop, "usage": usage}, False)
    )
    events.append(("message_stop", {"type": "message_stop"}, False))
    return events


def openai_chunks(answer: Answer, model: str, *, usage: bool) -> list[Event]:
    """Chat Completions' stream of ``openai_answer``: ``chat.completion.chunk``s, then the
    usage chunk when asked for (``stream_options.include_usage``), then ``[DONE]``."""
    whole = openai_answer(answer, model)
    message, finish = whole["choices"][0]["message"], whole["choices"][0]["finish_reason"]

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, text: bool = False) -> Event:
        body = {
            "id": whole["id"],
            "object": "chat.completion.chunk",
            "created": whole["created"],
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        return (None, body, text)

    events = [chunk({"role": "assistant", "content": ""})]
    if "reasoning_content" in message:
        events.append(chunk({"reasoning_content": message["reasoning_content"]}))
    if message["content"]:
        events += [chunk({"content": p}, text=True) for p in text_pieces(message["content"])]
    for index, call in enumerate(message.get("tool_calls", [])):
        start = {
            **call,
            "index": index,
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        events.append(chunk({"tool_calls": [start]}))
        arguments = {"index": index, "function": {"arguments": call["function"]["arguments"]}}
        events.append(chunk({"tool_calls": [arguments]}))
    events.append(chunk({}, finish))
    if usage:
        body = {key: whole[key] for key in ("id", "created", "model")}
        body.update({"object": "chat.completion.chunk", "choices": [], "usage": whole["usage"]})
        events.append((None, body, False))
    events.append((None, "[DONE]", False))
    return events


# --- API bodies ------------------------------------------------------------------------------

ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def whole_answer(api: Api, answer: Answer, model: str) -> dict[str, Any]:
    return anthropic_answer(answer, model) if api == "anthropic" else openai_answer(answer, model)


def anthropic_answer(answer: Answer, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if answer.thinking:
        content.append({"type": "thinking", "thinking": answer.thinking, "signature": "sig"})
    if answer.text:
        content.append({"type": "text", "text": answer.text})
    content += [
        {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
        for call_id, name, arguments in answer.calls
    ]
    natural = "tool_use" if answer.calls else "end_turn"
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": answer.stop or natural,
        "stop_sequence": None,
        "usage": {
            "input_tokens": answer.usage.input,
            "output_tokens": answer.usage.output,
            "cache_read_input_tokens": answer.usage.cache_read,
            "cache_creation_input_tokens": answer.usage.cache_write,
        },
    }


def openai_answer(answer: Answer, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.thinking:
        message["reasoning_content"] = answer.thinking
    if answer.calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
            for call_id, name, arguments in answer.calls
        ]
    natural = "tool_calls" if answer.calls else "stop"
    prompt = answer.usage.input + answer.usage.cache_read  # OpenAI counts cached tokens in
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": answer.stop or natural}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": answer.usage.output,
            "total_tokens": prompt + answer.usage.output,
            "prompt_tokens_details": {"cached_tokens": answer.usage.cache_read},
        },
    }


def anthropic_error(failure: Failure) -> dict[str, Any]:
    kind = failure.code or ANTHROPIC_ERROR_TYPES.get(failure.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": failure.message}}


def openai_error(failure: Failure) -> dict[str, Any]:
    return {
        "error": {
            "message": failure.message,
            "type": "invalid_request_error" if failure.status < 500 else "server_error",
            "param": None,
            "code": failure.code,
        }
    }
