"""Live text of a durable turn (issue #26): the worker's live-stream server, ``llm_step``
streaming through the official SDKs from the fake API's server-sent events, and
``TurnHandle.stream()`` on the real dev server; and the reader's own promises (it gives up on a
silent server, hangs up when cancelled, verifies TLS) against a bare server. Nothing here
measures time: the fake API holds a call's last chunk until the test has seen its first
deltas, so "before the call completes" is a fact of the order of events, not of a clock."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import os
import ssl
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf import json_format
from temporalio.client import Client

from tests.conftest import HarnessFactory, eventually, make_settings, turnkeep
from tests.worker_process import WorkerProcesses, write_config
from turnkeep.client import live
from turnkeep.client.connection import connect
from turnkeep.client.live import (
    PATH_PREFIX,
    LiveStreamRefused,
    MessageEvent,
    Restarted,
    StreamEvent,
    TextDelta,
    ToolCallStart,
    live_address,
    live_http_client,
    sse_events,
)
from turnkeep.client.sessions import open_session
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.contract.live_io import LiveAddress
from turnkeep.contract.messages import Message, StopReason, TextContent
from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing.fake_api import Answer, FakeModelApi, Reply
from turnkeep.worker.build import build_worker

pytestmark = pytest.mark.asyncio

KEY = "sk-turnkeep-live-0b7c"
APIS = ("anthropic", "openai")


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def config(api: str, fake: FakeModelApi, **extra: Any) -> dict[str, Any]:
    base_url = fake.base_url_anthropic if api == "anthropic" else fake.base_url_openai
    return {
        api: {"api_key": KEY, "base_url": base_url},
        "agents": {
            "test": {
                "model": f"{api}.test-model",
                "servers": ["math"],
                "llm_timeouts": {"start_to_close": 60, "heartbeat": 10, "max_attempts": 2},
            }
        },
        **extra,
    }


STREAMING = {"streaming": {"listen": "127.0.0.1:0"}}


async def collect(handle: TurnHandle, release: threading.Event | None = None) -> list[StreamEvent]:
    """Every event of the turn's stream; ``release`` is set at the first text delta."""
    events: list[StreamEvent] = []
    async for event in handle.stream(include_tool_results=True):
        events.append(event)
        if release is not None and isinstance(event, TextDelta):
            release.set()
    return events


def messages(events: list[StreamEvent]) -> list[Message]:
    return [e.message for e in events if isinstance(e, MessageEvent)]


@pytest.mark.parametrize("api", APIS)
async def test_deltas_arrive_in_order_before_the_call_completes(
    api: str, fake: FakeModelApi, harness: HarnessFactory
) -> None:
    held = threading.Event()
    try:
        fake.script(
            # The last text chunk waits until the watcher has seen a delta: the call cannot
            # complete (nor its message reach history) before that.
            Answer(
                text="Let me add these.",
                calls=(("call_1", "math__add", {"a": 2, "b": 3}),),
                hold=held,
            ),
            Reply.text("The sum is 5."),
            api=api,  # type: ignore[arg-type]
        )
        async with harness({"math": [add]}, **config(api, fake, **STREAMING)) as h:
            handle = await h.start("2+3?")
            events = await collect(handle, held)
            result = await handle.result()
    finally:
        held.set()

    first_call = [e for e in events if isinstance(e, TextDelta) and e.call_index == 1]
    assert "".join(d.text for d in first_call) == "Let me add these."
    assert len(first_call) > 1  # word by word, as the provider streamed it
    assert {d.attempt for d in first_call} == {1}
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.name, s.call_id) for s in starts][:1] == [("math__add", "call_1")]
    # The live text came before the completed message, which is the one in history.
    first_message = next(i for i, e in enumerate(events) if isinstance(e, MessageEvent))
    assert events.index(first_call[0]) < first_message
    assert messages(events) == result.messages[1:]
    assert result.final is not None and result.final.text == "The sum is 5."
    # The SDK asked the fake API to stream.
    assert all(r.body.get("stream") is True for r in fake.requests_for(api))  # type: ignore[arg-type]


@pytest.mark.parametrize("api", APIS)
async def test_history_is_the_same_size_with_and_without_streaming(
    api: str, fake: FakeModelApi, harness: HarnessFactory
) -> None:
    async def run(**extra: Any) -> tuple[list[Message], list[tuple[int, int]]]:
        fake.script(
            Reply.text("A streamed answer of several words, to compare histories."),
            api=api,  # type: ignore[arg-type]
        )
        async with harness({"math": [add]}, **config(api, fake, **extra)) as h:
            handle = await h.start("Say something.")
            result = await handle.result()
            history = await handle.handle.fetch_history()
        # Per event: its type and the bytes of its payloads (ids and timestamps aside).
        sizes = [(int(e.event_type), payload_bytes(e)) for e in history.events]
        return result.messages, sizes

    plain_messages, plain_sizes = await run()
    streamed_messages, streamed_sizes = await run(**STREAMING)
    assert [r.body.get("stream") for r in fake.requests_for(api)] == [None, True]  # type: ignore[arg-type]
    assert streamed_messages == plain_messages
    assert streamed_sizes == plain_sizes


def payload_bytes(event: Any) -> int:
    """The bytes of every payload in a history event (as ``history_text`` finds them)."""
    total = 0

    def walk(node: Any) -> None:
        nonlocal total
        if isinstance(node, dict):
            if "metadata" in node and isinstance(node.get("data"), str):
                total += len(base64.b64decode(node["data"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json_format.MessageToDict(event))
    return total


async def test_a_watcher_that_cannot_reach_the_live_stream_gets_the_messages(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    # The worker advertises an address nobody listens on (port 1): the watcher falls back.
    unreachable = {"streaming": {"listen": "127.0.0.1:0", "advertise": "http://127.0.0.1:1"}}
    fake.script(Reply.text("Only whole messages here.", chunk_delay=0.05), api="openai")
    async with harness({"math": [add]}, **config("openai", fake, **unreachable)) as h:
        handle = await h.start("hello")
        events = await collect(handle)
        result = await handle.result()
    assert all(isinstance(e, MessageEvent) for e in events)
    assert messages(events) == result.messages[1:]
    assert result.final is not None and result.final.text == "Only whole messages here."


async def test_a_server_that_refuses_stream_options_streams_without_them_and_is_asked_once(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    """An OpenAI-compatible server that does not know ``stream_options`` (a 400 naming it):
    the call is made again without them, still streamed, and the provider remembers, so the
    next call does not pay a refused request first."""
    fake.refuse_field("stream_options")
    held = threading.Event()
    generic = {
        "generic": {"base_url": fake.base_url_openai},
        "agents": {"test": {"model": "generic.local-model"}},
        **STREAMING,
    }
    try:
        fake.script(
            Answer(text="Streamed without usage.", hold=held),
            Reply.text("Asked once."),
            api="openai",
        )
        async with harness(**generic) as h:
            first = await h.start("one")
            events = await collect(first, held)
            first_result = await first.result()
            second = await (await h.start("two")).result()
    finally:
        held.set()
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert "".join(d.text for d in deltas) == "Streamed without usage."
    assert first_result.final is not None and first_result.final.text == "Streamed without usage."
    assert second.final is not None and second.final.text == "Asked once."
    bodies = [r.body for r in fake.requests_for("openai")]
    assert [("stream_options" in b, b.get("stream")) for b in bodies] == [
        (True, True),  # refused
        (False, True),  # the same call again, streamed
        (False, True),  # the next call: no refused request first
    ]
    # The server sent no usage unasked, so the calls count none.
    assert first_result.usage["generic.local-model"].output_tokens == 0


def generic_config(fake: FakeModelApi, **generic: Any) -> dict[str, Any]:
    """A worker serving live text whose agent's model is on an OpenAI-compatible server."""
    return {
        "generic": {"base_url": fake.base_url_openai, **generic},
        "agents": {"test": {"model": "generic.local-model", "servers": ["math"]}},
        **STREAMING,
    }


async def test_a_server_that_answers_streamed_calls_whole_completes_the_turn(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    """Issue #43: a compatible server that answers ``stream: true`` with a plain JSON
    completion. Each whole answer is the call's answer, and reaches the live stream at once."""
    held = threading.Event()
    try:
        fake.script(
            # Held until the test has found the call's live stream.
            Answer(
                text="Adding.",
                calls=(("call_1", "math__add", {"a": 2, "b": 3}),),
                hold=held,
                streamed_as="json",
            ),
            Reply.text("The sum is 5.", streamed_as="json"),
            api="openai",
        )
        async with harness({"math": [add]}, **generic_config(fake)) as h:
            handle = await h.start("2+3?")

            async def address() -> LiveAddress | None:
                return await live_address(h.client, handle.handle)

            found: LiveAddress = await eventually(address, "the model call is streaming")
            held.set()
            # The attempt's stream from its start, to its end.
            deltas = [d async for d in live.read_live(h.client, found)]
            result = await handle.result()
    finally:
        held.set()

    assert [(d.kind, d.text, d.name, d.call_id) for d in deltas] == [
        ("text", "Adding.", None, None),
        ("tool_call", "", "math__add", "call_1"),
    ]
    assert result.stop_reason == StopReason.END_TURN
    assert result.final is not None and result.final.text == "The sum is 5."
    tool_results = [m.tool_results for m in result.messages if m.tool_results]
    assert tool_results[0] is not None and tool_results[0]["call_1"].text == "5"
    assert [r.body.get("stream") for r in fake.requests_for("openai")] == [True, True]


async def test_a_stream_cut_before_its_stop_ends_the_turn_with_the_fix_and_no_retry(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(Reply.text("The sum is", streamed_as="no_stop"), api="openai")
    async with harness({"math": [add]}, **generic_config(fake)) as h:
        result = await (await h.start("2+3?")).result()

    assert result.stop_reason == StopReason.ERROR
    assert result.final is not None
    said = str(result.final.channels)
    assert "ended without a finish_reason" in said
    assert "`generic: {streaming: false}`" in said
    assert len(fake.requests_for("openai")) == 1  # not retried: asking again gets the same


async def test_streaming_false_on_a_provider_makes_its_calls_whole(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(Reply.text("Whole, as configured."), api="openai")
    async with harness({"math": [add]}, **generic_config(fake, streaming=False)) as h:
        handle = await h.start("hello")
        events = await collect(handle)
        result = await handle.result()
    assert result.final is not None and result.final.text == "Whole, as configured."
    assert "stream" not in fake.requests_for("openai")[0].body
    assert all(isinstance(e, MessageEvent) for e in events)


async def test_turnkeep_run_with_its_worker_against_a_server_that_does_not_stream(
    temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    """The command of the issue, as a user runs it: ``turnkeep run --worker`` streams each
    model call, and the server answers with a plain JSON completion."""
    write_config(
        tmp_path / "turnkeep.yaml",
        {
            "task_queue": f"nostream-{uuid.uuid4().hex[:8]}",
            "generic": {"base_url": fake.base_url_openai},
            "agents": {"test": {"model": "generic.local-model"}},
        },
    )
    fake.script(Reply.text("Hello from a server that does not stream.", streamed_as="json"))
    done = await asyncio.to_thread(
        turnkeep,
        "run",
        "hello",
        "--agent",
        "test",
        "--worker",
        "--json",
        temporal=temporal,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    result = TurnResult.model_validate_json(done.stdout)
    assert result.final is not None
    assert result.final.text == "Hello from a server that does not stream."
    (sent,) = fake.requests_for("openai")
    assert sent.body.get("stream") is True  # the worker did stream the call
    # The answer is printed once, live or whole.
    assert done.stderr.count("Hello from a server that does not stream.") == 1, done.stderr


async def test_the_live_stream_refuses_a_wrong_or_missing_token(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    held = threading.Event()
    try:
        fake.script(Reply.text("Secret words stream here.", hold=held), api="anthropic")
        async with harness({"math": [add]}, **config("anthropic", fake, **STREAMING)) as h:
            handle = await h.start("hello")

            async def address() -> LiveAddress | None:
                return await live_address(h.client, handle.handle)

            found: LiveAddress = await eventually(address, "the model call is streaming")
            url = f"{found.url}{PATH_PREFIX}{found.call_key}"
            wrong = await status_of(url, {"authorization": "Bearer not-the-token"})
            missing = await status_of(url, {})
            other_key = await status_of(
                f"{found.url}{PATH_PREFIX}nope", {"authorization": f"Bearer {found.token}"}
            )
            held.set()
            right = [
                event async for event in sse_events(url, {"authorization": f"Bearer {found.token}"})
            ]
            result = await handle.result()
    finally:
        held.set()
    assert (wrong, missing, other_key) == (403, 403, 403)
    # The right token gets the whole stream, ending with `end`; the text itself is a
    # converter payload, not plain text on the wire.
    assert [event.event for event in right][-1] == "end"
    assert "delta" in {event.event for event in right}
    assert "Secret" not in "".join(event.data for event in right)
    assert found.call_index == 1 and found.attempt == 1
    assert result.final is not None and result.final.text == "Secret words stream here."


async def status_of(url: str, headers: dict[str, str]) -> int:
    try:
        async for _ in sse_events(url, headers):
            return 200
    except LiveStreamRefused as refused:
        return refused.status
    return 200


@pytest.mark.slow
async def test_a_worker_killed_mid_stream_restarts_the_live_text(
    client: Client, temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    task_queue = f"live-{uuid.uuid4().hex[:10]}"
    settings = config("anthropic", fake, **STREAMING)
    settings["agents"]["test"].update(
        servers=[],
        llm_timeouts={"start_to_close": 60, "heartbeat": 2, "max_attempts": 3},
    )
    path = write_config(tmp_path / "turnkeep.yaml", {"task_queue": task_queue, **settings})
    first_held, second_held = threading.Event(), threading.Event()
    fake.script(
        Reply.text("The first attempt never ends.", hold=first_held),
        Reply.text("The second attempt is the answer.", hold=second_held),
        api="anthropic",
    )
    events: list[StreamEvent] = []
    try:
        with WorkerProcesses(path, temporal.address, tmp_path / "logs") as workers:
            doomed = await workers.start_polling(client, task_queue)
            handle = await start_turn(
                client, TurnInput(agent="test", messages=["hi"]), task_queue=task_queue
            )
            async for event in handle.stream():
                events.append(event)
                if (
                    isinstance(event, TextDelta)
                    and event.attempt == 1
                    and doomed in workers.running
                ):
                    workers.kill(doomed)  # mid-stream, as a crash would
                    workers.start()
                elif isinstance(event, Restarted):
                    second_held.set()
            result = await handle.result()
    finally:
        first_held.set()
        second_held.set()

    restarts = [e for e in events if isinstance(e, Restarted)]
    assert [(r.call_index, r.attempt) for r in restarts] == [(1, 2)]
    before = events[: events.index(restarts[0])]
    after = events[events.index(restarts[0]) :]
    assert any(isinstance(e, TextDelta) and e.attempt == 1 for e in before)
    retried = "".join(e.text for e in after if isinstance(e, TextDelta))
    assert retried == "The second attempt is the answer."
    # The final message is the one in history, not the text of the dead attempt.
    assert messages(events) == result.messages[1:]
    assert result.final is not None and result.final.text == "The second attempt is the answer."


async def test_the_cli_prints_live_text_once_and_marks_a_restart() -> None:
    from rich.console import Console

    from turnkeep.cli.render import TurnRenderer

    console = Console(record=True, width=200, force_terminal=False)
    renderer = TurnRenderer(console)
    final = Message(role="assistant", content=[TextContent(text="Hello there.")])
    for event in (
        TextDelta(text="Hel", call_index=1, attempt=1),
        Restarted(call_index=1, attempt=2),
        TextDelta(text="Hello ", call_index=1, attempt=2),
        TextDelta(text="there.", call_index=1, attempt=2),
        MessageEvent(message=final),
    ):
        renderer.live(event)
    lines = console.export_text().splitlines()
    assert lines == [
        "assistant › Hel",
        "[model call restarted: attempt 2]",
        "assistant › Hello there.",
    ]
    # A message not (wholly) seen live is printed as history has it.
    renderer.live(TextDelta(text="Partial", call_index=2, attempt=1))
    renderer.live(
        MessageEvent(
            message=Message(role="assistant", content=[TextContent(text="Partial answer.")])
        )
    )
    assert console.export_text().splitlines() == [
        "assistant › Partial",
        "assistant › Partial answer.",
    ]


async def test_with_encryption_the_address_and_the_text_travel_encrypted(
    client: Client, temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    base = config("anthropic", fake, **STREAMING)
    base["agents"]["test"]["servers"] = []
    encryption = {"current_key": "k1", "keys": {"k1": key}}
    settings = make_settings(tmp_path, encryption=encryption, **base)
    keyed = await connect(temporal.address, temporal.namespace, settings=settings)
    task_queue = f"test-{uuid.uuid4().hex[:10]}"
    held = threading.Event()
    secret = "Confidential-narwhal words"
    fake.script(Reply.text(secret, hold=held), api="anthropic")
    try:
        async with build_worker(keyed, settings, task_queue=task_queue):
            handle = await start_turn(
                keyed, TurnInput(agent="test", messages=["hi"]), task_queue=task_queue
            )

            async def address() -> LiveAddress | None:
                return await live_address(keyed, handle.handle)

            found: LiveAddress = await eventually(address, "the model call is streaming")
            # A client without the key cannot read the address (so has no token): it falls
            # back to whole messages.
            assert await live_address(client, handle.handle) is None
            # The keyed client decodes the text (the fake API waits for it to see some).
            events = await collect(handle, held)
            result = await handle.result()
            # The same stream as it travelled (a finished call's stream stays readable a while).
            auth = {"authorization": f"Bearer {found.token}"}
            url = f"{found.url}{PATH_PREFIX}{found.call_key}"
            raw = [event async for event in sse_events(url, auth)]
    finally:
        held.set()
    wire = b"".join(base64.b64decode(event.data) for event in raw if event.data)
    assert wire and b"narwhal" not in wire and b"Confidential" not in wire
    assert b"binary/encrypted" in wire  # the codec's payload encoding
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == secret
    assert result.final is not None and result.final.text == secret


async def test_a_session_streams_its_turns_live(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    held = threading.Event()
    try:
        fake.script(Reply.text("Hello from a session.", hold=held), api="openai")
        async with harness({"math": [add]}, **config("openai", fake, **STREAMING)) as h:
            session = await open_session(h.client, agent="test", task_queue=h.task_queue)
            sent = await session.send("hi")
            events: list[StreamEvent] = []
            async for event in session.stream(until_turn=sent.turn):
                events.append(event)
                if isinstance(event, TextDelta):
                    held.set()
            transcript = [m async for m in session.messages(until_turn=sent.turn)]
            await session.close()
    finally:
        held.set()
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello from a session."
    assert messages(events) == transcript
    assert transcript[-1].text == "Hello from a session."


# --- the reader's own promises, against a bare server -----------------------------------------

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


def sse_answer(events: bytes, *, ends: bool = True) -> bytes:
    """An event stream's answer: whole, or (``ends`` false) one that stays open."""
    length = f"content-length: {len(events)}\r\n".encode() if ends else b""
    return SSE_HEAD + length + b"\r\n" + events


@contextlib.asynccontextmanager
async def bare_server(
    answer: bytes | None, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A server that reads a request, writes ``answer`` (None: nothing, ever) and waits for the
    client to hang up; yields its URL and an event set once the client has."""
    hung_up = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            if answer is not None:
                writer.write(answer)
                await writer.drain()
            await reader.read()  # until the client closes its end
        hung_up.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1/calls/k", hung_up


async def test_a_live_server_that_never_answers_is_given_up_on_and_hung_up_on() -> None:
    async with bare_server(None) as (url, hung_up):
        with pytest.raises(TimeoutError):
            async for _ in sse_events(url, {}, connect_timeout=0.2):
                pass
        await asyncio.wait_for(hung_up.wait(), 30)


@pytest.mark.parametrize("shared", [False, True])
async def test_a_cancelled_reader_closes_its_connection(shared: bool) -> None:
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(live_http_client()) if shared else None
        url, hung_up = await stack.enter_async_context(
            bare_server(sse_answer(b"event: delta\ndata: AAAA\n\n", ends=False))
        )
        first: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def read() -> None:
            async for event in sse_events(url, {}, http=http):
                first.set_result(event.event)

        reader = asyncio.ensure_future(read())
        assert await asyncio.wait_for(first, 30) == "delta"
        reader.cancel()  # while it waits for the next event, as stream_turn's end does
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await asyncio.wait_for(hung_up.wait(), 30)


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that no system trusts, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "turnkeep test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


async def test_an_https_address_is_read_over_verified_tls(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cert_file, key_file = _self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert_file, key_file)
    answer = sse_answer(b"event: end\ndata:\n\n")
    try:
        # A certificate the system does not trust is refused...
        async with bare_server(answer, tls) as (url, _):
            with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                async for _ in sse_events(url, {}):
                    pass
        # ...and one it trusts (as SSL_CERT_FILE says) is read.
        monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
        live._tls_context.cache_clear()  # the system's CAs are loaded once per process
        async with bare_server(answer, tls) as (url, _):
            assert [event.event async for event in sse_events(url, {})] == ["end"]
    finally:
        monkeypatch.undo()
        live._tls_context.cache_clear()
