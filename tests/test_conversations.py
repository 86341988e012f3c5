"""A session's conversation by reference (``turnkeep.contract.conversation``,
``turnkeep.payloads.conversations``): each turn stores its messages once, as a segment, and the
session and its turns hand each other references, against the real dev server. The passthrough
model echoes the prompt, so each message names the turn it belongs to."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from google.protobuf.message import Message as Message_
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RawValue

from tests.conftest import Harness, HarnessFactory, eventually, history_text
from turnkeep.client.sessions import SessionHandle, open_session
from turnkeep.client.turns import get_turn
from turnkeep.contract.conversation import EXPANDED_METADATA, ConversationRef
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import MODEL_INPUT_PAGE_BYTES
from turnkeep.contract.turn_io import TurnInput
from turnkeep.payloads.conversations import DIRECTORY
from turnkeep.payloads.gc import collect
from turnkeep.payloads.storage import payload_directory
from turnkeep.payloads.storage.owners import owner_key
from turnkeep.testing import check_replay
from turnkeep.workflows.conversation_cache import ConversationCache
from turnkeep.workflows.conversation_cache import conversations as conversations_cache
from turnkeep.workflows.session_workflow import SessionWorkflow
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

pytestmark = pytest.mark.asyncio

AGENT = {"test": {"model": "passthrough"}}


def conversations(h: Harness) -> Path:
    return payload_directory(h.settings.payload_storage, h.settings.base_dir) / DIRECTORY


async def talk(session: SessionHandle, *lines: str) -> list[str]:
    """Send each line, following the session until its turn has ended; the texts seen."""
    start = (await session.progress()).count
    seen: list[str] = []
    for line in lines:
        sent = await session.send(line)
        index = start + len(seen)
        seen += [m.text async for m in session.messages(index, until_turn=sent.turn)]
    return seen


async def test_each_message_is_stored_once_and_turns_get_the_conversation_by_reference(
    harness: HarnessFactory,
) -> None:
    async with harness(agents=AGENT) as h:
        session = await open_session(h.client, agent="test", task_queue=h.task_queue)
        lines = [f"line {n} {uuid.uuid4().hex}" for n in range(1, 7)]
        seen = await talk(session, *lines)
        assert seen == [text for line in lines for text in (line, line)]
        # Two segments per turn, in the session's own directory: the messages the session
        # handed the turn, and those the turn added.
        segments = list((conversations(h) / owner_key(session.session_id)).iterdir())
        assert len(segments) == 2 * len(lines)
        # The last turn saw the whole conversation, but its history records none of the earlier
        # turns' messages: only a reference and its own.
        last = await get_turn(h.client, f"{session.session_id}/turn-6").handle.fetch_history()
        text = history_text(last)
        assert not any(line in text for line in lines[:-1]) and lines[-1] in text
        # A client reading that turn still gets its history, read back from the store.
        result = await get_turn(h.client, f"{session.session_id}/turn-6").result()
        assert result.conversation is not None
        assert [m.text for m in result.history] == [t for line in lines for t in (line, line)]
        # Nor does the session's own history record the conversation again for each turn: the
        # first turn's message is in it no more often than the last's.
        recorded = history_text(await session.handle.fetch_history())
        assert recorded.count(lines[0]) == recorded.count(lines[-1])
        await session.close()
        closed = await session.result()
    assert [m.text for m in closed.transcript] == seen
    assert [m.text for m in closed.history] == seen


async def test_a_session_of_large_messages_stores_each_once_and_stays_linear(
    harness: HarnessFactory,
) -> None:
    """Issue #43: messages so large that the conversation passes payload storage's threshold
    within a few turns. Each message is stored once (the turn's input in the segment its own
    goes on from), no stored file and no recorded payload holds the conversation, not even
    for a reader who asks for the whole transcript after every turn (the gateway's session
    page), and the histories' payloads plus storage stay within 2x the conversation plus 10 KB
    per turn (the bench measures whole histories)."""
    turns = 8
    async with harness(agents=AGENT) as h:
        directory = payload_directory(h.settings.payload_storage, h.settings.base_dir)
        # The directory is the test process's: what earlier tests stored there is not this
        # session's.
        earlier = {f for f in directory.rglob("*") if f.is_file()}
        session = await open_session(
            h.client, agent="test", task_queue=h.task_queue, turns_per_run=4
        )
        lines = [f"line {n} {uuid.uuid4().hex} " + "m" * 40_000 for n in range(1, turns + 1)]
        index = 0
        for line in lines:
            sent = await session.send(line)
            async for _ in session.messages(index, until_turn=sent.turn):
                index += 1
            whole = [m async for m in session.transcript()]
            assert [m.text for m in whole] == [
                t for line in lines[: sent.turn] for t in (line, line)
            ]
        conversation = sum(len(m.model_dump_json()) for m in whole)
        assert conversation > 2 * 256 * 1024  # well past the threshold
        stored = [f for f in directory.rglob("*") if f.is_file() and f not in earlier]
        heads = [line[:50].encode() for line in lines]
        for path in stored:
            data = path.read_bytes()
            assert sum(head in data for head in heads) <= 1, f"{path} holds several turns"
        # Each line is stored twice, as the user's message and as the model's echo of it.
        everything = b"".join(p.read_bytes() for p in stored)
        assert all(everything.count(head) == 2 for head in heads)
        events = await _runs(h.client, session.session_id)
        for n in range(1, turns + 1):
            events += await _runs(h.client, f"{session.session_id}/turn-{n}")
        # What the histories' payloads hold: their events' own fields vary with how many
        # workflow tasks a loaded machine takes, the payloads do not.
        recorded = sum(_payload_bytes(e) for e in events)
        # No event carries more than one turn's messages either.
        for event in events:
            data = event.SerializeToString()
            assert sum(head in data for head in heads) <= 1, event.event_type
        total = recorded + sum(p.stat().st_size for p in stored)
        assert total <= 2 * conversation + 10 * 1024 * turns, (recorded, total, conversation)
        await session.close()
        closed = await session.result()
    assert [m.text for m in closed.transcript] == [m.text for m in whole]


async def test_the_transcript_query_answers_a_page_at_a_time(harness: HarnessFactory) -> None:
    """A reader of a long transcript gets it in pages that each stay below the payload
    storage threshold, and ``transcript()`` joins them."""
    async with harness(agents=AGENT) as h:
        session = await open_session(h.client, agent="test", task_queue=h.task_queue)
        lines = [f"page line {n} " + "p" * 60_000 for n in range(1, 4)]
        await talk(session, *lines)
        first = await session.handle.query(SessionWorkflow.transcript, 0)
        assert 1 <= len(first) < 6
        assert sum(len(m.model_dump_json()) for m in first) <= MODEL_INPUT_PAGE_BYTES
        assert [m.text async for m in session.transcript()] == [t for t in lines for t in (t, t)]
        assert [m.text async for m in session.transcript(3, 5)] == [lines[1], lines[2]]


async def test_a_session_continued_as_new_carries_references(harness: HarnessFactory) -> None:
    async with harness(agents=AGENT) as h:
        session = await open_session(
            h.client, agent="test", task_queue=h.task_queue, turns_per_run=2
        )
        lines = [f"run line {n}" for n in range(1, 6)]
        seen = await talk(session, *lines)
        described = await session.handle.describe()
        first = described.raw_description.workflow_execution_info.first_run_id
        assert first and first != described.run_id  # it continued as new
        # The run it continued into was handed references, not the conversation.
        start = await h.client.get_workflow_handle(session.session_id).fetch_history()
        started = start.events[0].workflow_execution_started_event_attributes
        carried = [p.data for p in started.input.payloads]
        assert not any(lines[0].encode() in data for data in carried)
        # A follower from the start still reads every message, across the runs.
        assert [m.text async for m in session.messages(until_turn=5)] == seen
        turn = await get_turn(h.client, f"{session.session_id}/turn-5").result()
        assert [m.text for m in turn.history] == [t for line in lines for t in (line, line)]


async def test_a_worker_hands_the_next_turn_the_conversation_it_has_validated(
    harness: HarnessFactory,
) -> None:
    """The worker keeps the conversation a session's turn ended with, under the reference it
    handed back: the next turn takes it instead of validating the expanded copy, and it is
    exactly what the store holds. A worker without it (emptied) validates the copy and gives
    the same turns, and the session's histories replay either way."""
    async with harness(agents=AGENT) as h:
        session = await open_session(
            h.client, agent="test", task_queue=h.task_queue, turns_per_run=2
        )
        await talk(session, "one", "two", "three")
        result = await get_turn(h.client, f"{session.session_id}/turn-3").result()
        assert result.conversation is not None
        kept = conversations_cache.get(result.conversation)
        assert kept is not None
        assert list(kept.messages) == result.history  # read back from the store
        # The JSON kept for them is each message's own: model calls' digests depend on it.
        assert kept.json
        for message, _, text in kept.json.values():
            assert text == message.model_dump_json()
        # And the JSON of the last model call's request, which the next turn's first call
        # extends: it begins with the conversation's messages, the very objects.
        assert kept.run is not None
        assert all(a is b for a, b in zip(kept.run.messages, kept.messages, strict=False))
        assert [text for _, text in kept.run.parts] == [
            m.model_dump_json() for m in kept.run.messages
        ]
        conversations_cache.clear()
        assert await talk(session, "four") == ["four", "four"]
        fourth = await get_turn(h.client, f"{session.session_id}/turn-4").result()
        assert [m.text for m in fourth.history] == [
            t for line in ("one", "two", "three", "four") for t in (line, line)
        ]
        histories = [
            await get_turn(h.client, f"{session.session_id}/turn-{n}").handle.fetch_history()
            for n in (3, 4)
        ]
        described = await session.handle.describe()
        first = described.raw_description.workflow_execution_info.first_run_id
        histories.append(
            await h.client.get_workflow_handle(session.session_id, run_id=first).fetch_history()
        )
        histories.append(await session.handle.fetch_history())
        await check_replay(histories, settings=h.settings)  # warm
        conversations_cache.clear()
        await check_replay(histories, settings=h.settings)  # cold


async def test_a_turns_start_keeps_its_expanded_history_as_json_until_validated(
    harness: HarnessFactory,
) -> None:
    """The codec says where in a turn's start payload it expanded the history, and the
    converter leaves that part unparsed for a workflow's untyped arguments (a worker holding
    the conversation never needs it); validation parses it. Only the codec says so: the same
    metadata from a client is dropped, and spans that point elsewhere are ignored."""
    async with harness(agents=AGENT) as h:
        session = await open_session(h.client, agent="test", task_queue=h.task_queue)
        await talk(session, "one", "two")
        history = await get_turn(h.client, f"{session.session_id}/turn-2").handle.fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        codec, converter = h.client.data_converter.payload_codec, h.client.data_converter
        assert codec is not None
        [payload] = await codec.decode(list(started.input.payloads))
        span = json.loads(payload.metadata[EXPANDED_METADATA])["history"]
        assert [m["content"][0]["text"] for m in json.loads(payload.data[span[0] : span[1]])] == [
            "one",
            "one",
        ]
        [untyped] = converter.payload_converter.from_payloads([payload])
        assert untyped["history"] == payload.data[span[0] : span[1]]
        turn = TurnInput.model_validate(untyped)
        assert [m.text for m in turn.history] == ["one", "one"]
        assert turn == converter.payload_converter.from_payloads([payload], [TurnInput])[0]
        # Spans that are not where the codec put them: parsed whole, as any payload.
        moved = Payload(metadata=payload.metadata, data=payload.data)
        moved.metadata[EXPANDED_METADATA] = json.dumps({"history": [0, 5]}).encode()
        [whole] = converter.payload_converter.from_payloads([moved])
        assert isinstance(whole["history"], list) and len(whole["history"]) == 2
        # A client's metadata saying so never reaches the converter.
        forged = Payload(metadata=dict(started.input.payloads[0].metadata), data=b'{"a": 1}')
        forged.metadata[EXPANDED_METADATA] = json.dumps({"a": [5, 6]}).encode()
        [decoded] = await codec.decode([forged])
        assert EXPANDED_METADATA not in decoded.metadata


async def test_a_reference_copied_into_another_turn_is_refused(harness: HarnessFactory) -> None:
    """Digests are visible in any history; a client that copies one into a turn of its own
    must not get another session's conversation expanded into it."""
    async with harness(agents=AGENT) as h:
        session = await open_session(h.client, agent="test", task_queue=h.task_queue)
        secret = f"secret {uuid.uuid4().hex}"
        await talk(session, secret)
        turn = await get_turn(h.client, f"{session.session_id}/turn-1").result()
        ref = turn.conversation
        assert ref is not None and ref.head is not None
        # Copied into a turn a client starts itself: refused before anything runs.
        crafted = await _start(h, ref, "tell me what was said")
        with pytest.raises(WorkflowFailureError) as failed:
            await crafted.result()
        assert "only the session that owns a conversation" in str(failed.value.cause)
        history = await crafted.fetch_history()
        assert not any(
            e.HasField("activity_task_scheduled_event_attributes") for e in history.events
        )
        assert secret not in history_text(history)
        # Under another owner (its own id), the digest names nothing there: refused too.
        mine = ref.model_copy(update={"owner": "turn-mine"})
        crafted = await _start(h, mine, "again", workflow_id="turn-mine")
        with pytest.raises(WorkflowFailureError) as failed:
            await crafted.result()
        assert "not in" in str(failed.value.cause) or "only the session" in str(failed.value.cause)


async def _start(h: Harness, ref: ConversationRef, prompt: str, workflow_id: str | None = None):
    """A TurnWorkflow started by a client with a history reference, as a session writes one."""
    text = json.dumps(
        {
            "agent": "test",
            "messages": [prompt],
            "history": ref.history_marker(),
            "history_ref": ref.model_dump(mode="json"),
        }
    )
    payload = Payload(metadata={"encoding": b"json/plain"}, data=text.encode())
    return await h.client.start_workflow(
        WORKFLOW_NAME,
        RawValue(payload),
        id=workflow_id or f"crafted-{uuid.uuid4().hex[:8]}",
        task_queue=h.task_queue,
    )


async def test_gc_keeps_an_open_sessions_segments_however_old(
    harness: HarnessFactory, client: Client
) -> None:
    async with harness(agents=AGENT) as h:
        session = await open_session(h.client, agent="test", task_queue=h.task_queue)
        await talk(session, "one", "two")
        directory = conversations(h)
        segments = list((directory / owner_key(session.session_id)).iterdir())
        assert len(segments) == 4  # each turn's input and its own
        _age(segments, days=30)
        retention = timedelta(days=7)
        report = await collect(directory.parent, retention, client)
        assert report.in_use == 4 and not any(p in report.removed for p in segments)
        assert all(p.exists() for p in segments)
        # The session reads them for its next turn, which sees the whole conversation.
        assert await talk(session, "three") == ["three", "three"]
        turn = await get_turn(h.client, f"{session.session_id}/turn-3").result()
        assert [m.text for m in turn.history] == ["one", "one", "two", "two", "three", "three"]
        # Closed, and unread past the retention: its segments go.
        await session.close()
        await session.result()
        segments = list((directory / owner_key(session.session_id)).iterdir())
        _age(segments, days=30)

        async def swept() -> bool:
            # The namespace's list of running workflows catches up with the close soon.
            await collect(directory.parent, retention, client)
            return not any(p.exists() for p in segments)

        await eventually(swept, "the closed session's segments were swept")


def _payload_bytes(message: Message_) -> int:
    """The bytes of every payload in a protobuf message (an event), however deep."""
    if isinstance(message, Payload):
        return message.ByteSize()
    total = 0
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        items = value.values() if field.message_type.GetOptions().map_entry else value
        for item in items if field.is_repeated else [value]:
            if isinstance(item, Message_):
                total += _payload_bytes(item)
    return total


async def _runs(client: Client, workflow_id: str) -> list[HistoryEvent]:
    """The events of every run of a workflow, first to last (following continue-as-new)."""
    described = await client.get_workflow_handle(workflow_id).describe()
    run_id: str | None = described.raw_description.workflow_execution_info.first_run_id
    events: list[HistoryEvent] = []
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events += history.events
        last = history.events[-1].workflow_execution_continued_as_new_event_attributes
        run_id = last.new_execution_run_id or None
    return events


def _age(paths: list[Path], *, days: float) -> None:
    then = time.time() - days * 86400
    for path in paths:
        os.utime(path, (then, then))


async def test_the_conversation_cache_keeps_two_per_session_and_kind_within_its_bound() -> None:
    cache = ConversationCache(max_chars=10_000)
    ref = ConversationRef(owner="s1")
    texts = [Message.user(f"m{n}") for n in range(3)]
    for n in range(3):
        cache.put(ref.model_copy(update={"head": f"h{n}"}), texts[: n + 1])
    cache.put(ref.model_copy(update={"transcript": "t0"}), texts, kind="transcript")
    # The two latest histories of s1 are kept, and its transcript apart from them.
    assert cache.get(ref.model_copy(update={"head": "h0"})) is None
    kept = cache.get(ref.model_copy(update={"head": "h2"}))
    assert kept is not None and kept.messages == tuple(texts)
    assert cache.get(ref.model_copy(update={"head": "h1"})) is not None
    assert cache.get(ref.model_copy(update={"transcript": "t0"}), kind="transcript") is not None
    # Past its bound, the least recently used entries go first, whichever session's.
    big = [Message.user("x" * 9_000)]
    cache.put(ConversationRef(owner="s2", head="b"), big)
    assert cache.get(ref.model_copy(update={"head": "h2"})) is None  # the least recent
    assert cache.get(ConversationRef(owner="s2", head="b")) is not None
    cache.put(ConversationRef(owner="s3", head="c"), big)
    assert cache.get(ConversationRef(owner="s2", head="b")) is None
    assert len(cache) >= 1
