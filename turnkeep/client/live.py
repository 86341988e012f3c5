"""Following the live text of a turn's in-flight model calls, from a client.

Nothing of this goes through the workflow: a token in history would bring back the quadratic
history turnkeep got rid of. The worker serves each attempt of ``llm_step`` as server-sent
events (``turnkeep.worker.live_server``) and heartbeats the stream's ``LiveAddress``, which
only a client allowed to describe the turn's workflow reads. ``follow_live`` (behind
``TurnHandle.stream()``) finds the address by describing the workflow, connects, decodes each
``LiveBatch`` with the client's own converter and codec, and gives up silently (debug log) on
anything that goes wrong: the turn's messages still arrive, message by message, as without
streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Literal

import httpx2
from pydantic import BaseModel
from temporalio.client import Client, WorkflowHandle

from turnkeep.contract.activity_io import LLM_STEP
from turnkeep.contract.live_io import DELTA_EVENT, END_EVENT, PATH_PREFIX, LiveAddress, LiveDelta
from turnkeep.contract.messages import Message
from turnkeep.payloads.live_batch import decode_batch

log = logging.getLogger(__name__)

# How often a follower asks the server for a running model call's address while it has none:
# at first, and at most this seldom (it backs off while no call streams, and starts again
# quickly at each new message, after which a model call usually starts).
POLL_SECONDS = 0.1
MAX_POLL_SECONDS = 0.5
# A live server that does not answer this fast is given up on (the messages still come).
CONNECT_SECONDS = 3.0


# --- the worker's side -------------------------------------------------------------------------


# --- the client's side -------------------------------------------------------------------------


class TextDelta(BaseModel):
    """A piece of a model call's text, as the provider streamed it."""

    kind: Literal["text"] = "text"
    text: str
    call_index: int
    attempt: int


class ToolCallStart(BaseModel):
    """The model has started a tool call (its arguments come with the completed message)."""

    kind: Literal["tool_call"] = "tool_call"
    name: str
    call_id: str
    call_index: int


class Restarted(BaseModel):
    """A model call is being retried (its worker died, say): its live text starts over."""

    kind: Literal["restarted"] = "restarted"
    call_index: int
    attempt: int


class MessageEvent(BaseModel):
    """A completed message, as the turn's history holds it."""

    kind: Literal["message"] = "message"
    message: Message


StreamEvent = TextDelta | ToolCallStart | Restarted | MessageEvent


async def live_address(client: Client, handle: WorkflowHandle[Any, Any]) -> LiveAddress | None:
    """The address of the turn's running model call, from its heartbeat details; None when no
    call is streaming (or the details are not a ``LiveAddress``)."""
    description = await handle.describe()
    for pending in description.raw_description.pending_activities:
        if pending.activity_type.name != LLM_STEP or not pending.heartbeat_details.payloads:
            continue
        payloads = list(pending.heartbeat_details.payloads)
        try:
            address = (await client.data_converter.decode(payloads[:1], [LiveAddress]))[0]
        except Exception as err:  # older worker's text details, a key we lack: no live text
            log.debug("llm_step heartbeat details are not a live address: %s", type(err).__name__)
            continue
        if isinstance(address, LiveAddress):
            return address
    return None


class LiveStreamRefused(ConnectionError):
    """The live server answered something else than a stream (403: not authorised)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the live-stream server answered {status}")
        self.status = status


async def read_live(
    client: Client,
    address: LiveAddress,
    *,
    connect_timeout: float = CONNECT_SECONDS,
    http: httpx2.AsyncClient | None = None,
) -> AsyncIterator[LiveDelta]:
    """The deltas of one attempt, from its start, until its stream ends. Raises on a refused
    or broken connection (the caller falls back)."""
    events = sse_events(
        f"{address.url}{PATH_PREFIX}{address.call_key}",
        {"authorization": f"Bearer {address.token}"},
        connect_timeout=connect_timeout,
        http=http,
    )
    async with contextlib.aclosing(events):
        async for event in events:
            if event.event == DELTA_EVENT:
                for delta in await decode_batch(client.data_converter, event.data):
                    yield delta
            elif event.event == END_EVENT:
                return
    raise ConnectionError("the live stream ended before its call did")


async def sse_events(
    url: str,
    headers: dict[str, str],
    *,
    connect_timeout: float = CONNECT_SECONDS,
    http: httpx2.AsyncClient | None = None,
) -> AsyncGenerator[httpx2.ServerSentEvent, None]:
    """The events of an event stream, over ``http`` (default: a client of its own); http, or
    https for an ``advertise`` URL behind a TLS proxy. The answer's head must come within
    ``connect_timeout``, its events may take as long as a model call; any status but 200
    raises ``LiveStreamRefused``."""
    async with contextlib.AsyncExitStack() as stack:
        if http is None:
            http = await stack.enter_async_context(live_http_client())
        async with asyncio.timeout(connect_timeout):
            # No size limit: a late watcher's first event holds the whole text so far.
            source = await stack.enter_async_context(
                http.sse(url, headers=headers, max_event_size=None)
            )
        if source.response.status_code != 200:
            raise LiveStreamRefused(source.response.status_code)
        async for event in source:
            yield event


def live_http_client() -> httpx2.AsyncClient:
    """An HTTP client for live streams, which ``follow_live`` keeps for all a turn's calls."""
    return httpx2.AsyncClient(
        verify=_tls_context(),
        # The address the worker heartbeats is reached as it is, through no proxy the
        # environment names (HTTPS_PROXY, ALL_PROXY).
        trust_env=False,
        # sse_events bounds the wait for an answer's head; between events, a model may think.
        timeout=httpx2.Timeout(None),
    )


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # The system's CAs, loaded once per process: they are most of what a new client costs.
    return ssl.create_default_context()


async def follow_live(
    client: Client,
    handle: WorkflowHandle[Any, Any],
    emit: Callable[[StreamEvent], None],
    *,
    poll: float = POLL_SECONDS,
    nudge: asyncio.Event | None = None,
) -> None:
    """Emit the live deltas of each model call of the turn while it runs (until cancelled).
    Every failure is logged at debug level and skipped: the caller's messages are the truth."""
    followed: dict[int, int] = {}  # call index -> the attempt last followed
    tried: set[str] = set()  # call keys already read (or given up on)
    nudge = nudge or asyncio.Event()
    delay = poll
    # One client for the turn's calls: the next call's stream may reuse the connection.
    async with live_http_client() as http:
        while True:
            # asyncio.wait_for can swallow a cancellation that lands as its wait ends (Python
            # 3.11); the task still says it is being cancelled, so this loop cannot outlive it.
            _raise_if_cancelled()
            try:
                address = await live_address(client, handle)
            except Exception as err:
                _raise_if_cancelled()  # a cancelled RPC raises an RPCError, not CancelledError
                log.debug("cannot describe the turn for its live address: %s", type(err).__name__)
                address = None
            if address is None or address.call_key in tried:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(nudge.wait(), delay)
                delay = poll if nudge.is_set() else min(delay * 1.5, MAX_POLL_SECONDS)
                nudge.clear()
                continue
            delay = poll
            tried.add(address.call_key)
            previous = followed.get(address.call_index)
            if previous is not None and address.attempt > previous:
                emit(Restarted(call_index=address.call_index, attempt=address.attempt))
            followed[address.call_index] = address.attempt
            try:
                async for delta in read_live(client, address, http=http):
                    if delta.kind == "text":
                        emit(
                            TextDelta(
                                text=delta.text,
                                call_index=address.call_index,
                                attempt=address.attempt,
                            )
                        )
                    else:
                        emit(
                            ToolCallStart(
                                name=delta.name or "",
                                call_id=delta.call_id or "",
                                call_index=address.call_index,
                            )
                        )
            except Exception as err:
                _raise_if_cancelled()
                # Unreachable, refused, cut off (the worker died), undecodable: message-level.
                log.debug("live stream of model call #%d: %s", address.call_index, repr(err)[:200])


def _raise_if_cancelled() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


async def stream_turn(
    client: Client,
    handle: WorkflowHandle[Any, Any],
    messages: AsyncIterator[Message],
) -> AsyncIterator[StreamEvent]:
    """``messages`` as ``MessageEvent``s, with the live deltas of each model call in between,
    until ``messages`` ends."""
    queue: asyncio.Queue[StreamEvent | BaseException | None] = asyncio.Queue()
    nudge = asyncio.Event()

    async def pump() -> None:
        try:
            async for message in messages:
                queue.put_nowait(MessageEvent(message=message))
                nudge.set()  # a model call is likely to start: look for it now
        except BaseException as err:  # handed to the consumer, who raises it
            queue.put_nowait(err)
            return
        queue.put_nowait(None)

    tasks = [
        asyncio.ensure_future(pump()),
        asyncio.ensure_future(follow_live(client, handle, queue.put_nowait, nudge=nudge)),
    ]
    try:
        while (event := await queue.get()) is not None:
            if isinstance(event, BaseException):
                raise event
            yield event
    finally:
        for task in tasks:
            task.cancel()
        # Bounded: the turn's messages are all out, nothing here may hold the caller up.
        await asyncio.wait(tasks, timeout=5)
