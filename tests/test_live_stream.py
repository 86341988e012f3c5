"""Live text of a durable turn (issue #26): the worker's live-stream server, ``llm_step``
streaming through the official SDKs from the fake API's server-sent events, and
``TurnHandle.stream()`` on the real dev server. Nothing here measures time: the fake API holds
a call's last chunk until the test has seen its first deltas, so "before the call completes"
is a fact of the order of events, not of a clock."""

from __future__ import annotations

import base64
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from temporalio.client import Client

from tests.conftest import HarnessFactory, eventually, make_settings
from tests.worker_process import WorkerProcesses, write_config
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
    sse_lines,
)
from turnkeep.client.sessions import open_session
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing.fake_api import Answer, FakeModelApi, Reply
from turnkeep.worker.build import build_worker
from turnkeep.workflows.live_io import LiveAddress
from turnkeep.workflows.messages import Message, TextContent
from turnkeep.workflows.turn_io import TurnInput

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
                line async for line in sse_lines(url, {"authorization": f"Bearer {found.token}"})
            ]
            result = await handle.result()
    finally:
        held.set()
    assert (wrong, missing, other_key) == (403, 403, 403)
    # The right token gets the whole stream, ending with `end`; the text itself is a
    # converter payload, not plain text on the wire.
    assert [line for line in right if line.startswith("event:")][-1] == "event: end"
    assert "delta" in "".join(right) and "Secret" not in "".join(right)
    assert found.call_index == 1 and found.attempt == 1
    assert result.final is not None and result.final.text == "Secret words stream here."


async def status_of(url: str, headers: dict[str, str]) -> int:
    try:
        async for _ in sse_lines(url, headers):
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
            raw = [line async for line in sse_lines(url, auth)]
    finally:
        held.set()
    wire = b"".join(
        base64.b64decode(line[5:].strip())
        for line in raw
        if line.startswith("data:") and line[5:].strip()
    )
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
