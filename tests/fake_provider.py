"""A fake Anthropic / OpenAI API over real HTTP on 127.0.0.1, for tests and benchmarks.

It speaks ``POST /v1/messages`` (Anthropic) and ``POST /v1/chat/completions`` (OpenAI), both
non-streaming, answering from a script of steps, one per request, in order, per API::

    with FakeProvider() as fake:
        fake.script(
            Reply.error(429, "slow down", headers={"retry-after": "2"}),
            Reply.tool_calls(("call_1", "srv__tool", {"a": 1})),
            Reply.delay(0.5, then=Reply.text("done", usage=Tokens(input=100, output=7))),
        )
        client = AsyncAnthropic(api_key="k", base_url=fake.base_url_anthropic)
        ...
        assert fake.requests[0].body["messages"] == [...]

It records every request (JSON body, headers, arrival time) for assertions.

It is a tiny HTTP/1.1 server on asyncio streams rather than an ASGI app, because it must be able
to hang up without answering (``Reply.drop()``), which ASGI servers turn into a 500. It runs on
its own event loop in a daemon thread, so it works the same under any test loop scope, and a
``Reply.delay`` ends early when the client gives up waiting, so shutdown never waits on it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

Api = Literal["anthropic", "openai"]
APIS: tuple[Api, ...] = ("anthropic", "openai")
ROUTES: dict[str, Api] = {"/v1/messages": "anthropic", "/v1/chat/completions": "openai"}


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


class Reply:
    """Constructors for script steps."""

    @staticmethod
    def text(
        text: str, *, thinking: str | None = None, stop: str | None = None, usage: Tokens = Tokens()
    ) -> Answer:
        return Answer(text=text, thinking=thinking, stop=stop, usage=usage)

    @staticmethod
    def tool_calls(
        *calls: tuple[str, str, Any],
        text: str | None = None,
        stop: str | None = None,
        usage: Tokens = Tokens(),
    ) -> Answer:
        return Answer(text=text, calls=calls, stop=stop, usage=usage)

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


class FakeProvider:
    def __init__(self, *, default: Step | None = None) -> None:
        """``default`` answers once a script runs out (benchmarks); without it such a request
        gets a 400 saying the script is exhausted, which no provider adapter retries."""
        self.default = default
        self._scripts: dict[Api, deque[Step]] = {api: deque() for api in APIS}
        self._requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.port = 0

    # --- public API -------------------------------------------------------------------------

    @property
    def base_url_anthropic(self) -> str:
        return f"http://127.0.0.1:{self.port}"  # the SDK appends /v1/messages

    @property
    def base_url_openai(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"  # the SDK appends /chat/completions

    def script(self, *steps: Step, api: Api | None = None) -> None:
        """Append steps to the script of one API, or of both (each serves its own copy)."""
        with self._lock:
            for name in (api,) if api else APIS:
                self._scripts[name].extend(steps)

    def pending(self, api: Api) -> int:
        with self._lock:
            return len(self._scripts[api])

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def requests_for(self, api: Api) -> list[Recorded]:
        return [r for r in self.requests if r.api == api]

    def reset(self) -> None:
        with self._lock:
            for queue in self._scripts.values():
                queue.clear()
            self._requests.clear()

    def start(self) -> FakeProvider:
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name="fake-provider", daemon=True
        )
        self._thread.start()
        if not ready.wait(10) or failure:
            raise RuntimeError(f"fake provider did not start: {failure}")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> FakeProvider:
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
        api = ROUTES.get(path.split("?")[0])
        if api is None:
            await send(writer, 404, {"error": {"message": f"no route {path}"}})
            return True
        with self._lock:
            self._requests.append(Recorded(api, path, headers, body, time.monotonic()))
            script = self._scripts[api]
            step = script.popleft() if script else self.default
        if step is None:
            step = Failure(400, f"fake provider: the {api} script is exhausted")
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
            case Answer():
                payload = (
                    anthropic_answer(step, model)
                    if api == "anthropic"
                    else openai_answer(step, model)
                )
                await send(writer, 200, payload, id_header)
            case Failure():
                payload = anthropic_error(step) if api == "anthropic" else openai_error(step)
                await send(writer, step.status, payload, {**id_header, **step.headers})
            case Raw():
                await send(writer, step.status, step.body, step.headers, step.content_type)
        return True


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
