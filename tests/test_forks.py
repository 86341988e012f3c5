"""Forks (``SessionHandle.fork``, ``TurnHandle.fork``, ``turnkeep.client.forks``): a new
session whose conversation is another's first messages, against the real dev server. The
passthrough model echoes the last user message, so each answer says which prompt it answers
and each turn's history shows what the fork started from."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError

from tests.conftest import (
    Harness,
    HarnessFactory,
    eventually,
    history_text,
    make_settings,
    turnkeep,
)
from tests.test_codec import encryption, new_key, worker_for
from tests.test_conversations import _age, conversations, talk
from tests.test_gateway import ADMIN, OTHER, PASSTHROUGH, READER, bearer, gateway
from tests.test_sessions import chat
from turnkeep.client.connection import connect
from turnkeep.client.forks import ForkError, fork
from turnkeep.client.history import read_turn
from turnkeep.client.sessions import SessionHandle, get_session, open_session
from turnkeep.client.turns import get_turn, start_turn
from turnkeep.contract.conversation import ConversationRef
from turnkeep.contract.messages import Message
from turnkeep.contract.session_io import SESSION_WORKFLOW_NAME, ForkOrigin, SessionInput
from turnkeep.contract.turn_io import TurnInput
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.payloads.gc import collect
from turnkeep.payloads.storage.owners import owner_key
from turnkeep.worker.build import build_worker
from turnkeep.workflows import visibility
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio


def echo(text: str) -> str:
    """A quick tool."""
    return f"echo {text}"


AGENT = {"test": {"model": "passthrough", "servers": ["local"]}, "other": {"model": "passthrough"}}
TOOLS = {"local": [echo]}


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


async def transcript(session: SessionHandle) -> list[Message]:
    return [m async for m in session.transcript()]


async def first_turn(h: Harness, fork_: SessionHandle, line: str) -> list[Message]:
    """Send ``line`` to a fork and return the history its first turn was given."""
    sent = await fork_.send(line)
    async for _ in fork_.messages((await fork_.progress()).count, until_turn=sent.turn):
        pass
    result = await get_turn(h.client, sent.turn_id).result()
    return result.history[: -len(result.messages)]


async def test_a_fork_goes_on_from_the_first_messages_and_leaves_the_source_alone(
    harness: HarnessFactory,
) -> None:
    async with harness(agents=AGENT, function_tools=TOOLS) as h:
        source = await open_session(h.client, agent="test", task_queue=h.task_queue)
        await talk(source, "one", "two", "three")
        before = await transcript(source)
        forked = await source.fork(3, message="four", task_queue=h.task_queue)
        assert forked.session_id != source.session_id
        sent_turn = f"{forked.session_id}/turn-1"
        async for _ in forked.messages(3, until_turn=1):
            pass
        # The fork's conversation is the source's first 3 messages, numbered as there, then
        # its own; its first turn saw exactly those 3 as history.
        # (The passthrough model answers the user messages in a row together.)
        expected = ["one", "one", "two", "four", "two\nfour"]
        assert texts(await transcript(forked)) == expected
        turn = await get_turn(h.client, sent_turn).result()
        assert texts(turn.history) == expected
        # The source is untouched, and goes on.
        assert await transcript(source) == before
        assert await talk(source, "more") == ["more", "more"]
        # Where it came from: the search attribute and the Web UI's summary.
        described = await forked.handle.describe()
        assert described.typed_search_attributes.get(visibility.FORK_OF) == (
            f"{source.session_id}@3"
        )
        assert f"forked from {source.session_id} at message 3" in (
            await described.static_summary() or ""
        )
        # Shared by reference: the fork stored one small segment of its own before its turn
        # (the message after the shared whole segments), not the conversation again.
        mine = sorted((conversations(h) / owner_key(forked.session_id)).iterdir())
        assert len(mine) == 1 + 1 + 2  # its seed, the note of its base, its turn's two
        notes = [p for p in mine if p.name == "forked-from"]
        assert notes[0].read_text().split() == [owner_key(source.session_id)]
        seed_history = history_text(await forked.handle.fetch_history())
        assert "one" not in seed_history.replace(source.session_id, "")
        await forked.close()
        closed = await forked.result()
        assert texts(closed.transcript) == expected
        await source.close()


async def test_a_fork_of_a_fork_and_of_a_turn(harness: HarnessFactory) -> None:
    async with harness(agents=AGENT, function_tools=TOOLS) as h:
        source = await open_session(h.client, agent="test", task_queue=h.task_queue)
        await talk(source, "one", "two")
        first = await source.fork(4, task_queue=h.task_queue)
        assert await talk(first, "three") == ["three", "three"]
        # A fork of the fork, at a message of its own turn.
        second = await first.fork(5, task_queue=h.task_queue)
        assert texts(await first_turn(h, second, "x")) == ["one", "one", "two", "two", "three"]
        # A session's turn is forked as its session, counted within the turn's messages.
        turn = get_turn(h.client, f"{source.session_id}/turn-2")
        third = await turn.fork(1, agent="other", task_queue=h.task_queue)
        assert texts(await first_turn(h, third, "y")) == ["one", "one", "two"]
        assert (await third.handle.describe()).typed_search_attributes.get(
            visibility.FORK_OF
        ) == f"{source.session_id}/turn-2@1"
        for session in (source, first, second, third):
            await session.close()


async def test_a_fork_inside_a_tool_batch_is_repaired_as_cancellation_does(
    harness: HarnessFactory,
) -> None:
    async with harness(agents=AGENT, function_tools=TOOLS) as h:
        source = await open_session(h.client, agent="test", task_queue=h.task_queue)
        sent = await source.send('***CALL_TOOL local__echo {"text": "x"}')
        async for _ in source.messages(0, until_turn=sent.turn):
            pass
        messages = await transcript(source)
        assert messages[1].tool_calls and messages[2].tool_results
        forked = await source.fork(2, task_queue=h.task_queue)
        history = await first_turn(h, forked, "go on")
        assert history[:2] == messages[:2]
        [result] = (history[2].tool_results or {}).values()
        assert result.is_error and result.text == INTERRUPTED_TEXT
        await forked.close()
        await source.close()


async def test_a_fork_without_payload_storage_carries_the_messages(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, agents=AGENT, payload_storage={"driver": "off"})
    client = await connect(temporal.address, temporal.namespace, settings=settings)
    task_queue = f"test-{uuid.uuid4().hex[:10]}"
    async with build_worker(client, settings, function_tools=TOOLS, task_queue=task_queue):
        h = Harness(client, settings, task_queue)
        source = await open_session(h.client, agent="test", task_queue=h.task_queue)
        await talk(source, "one", "two")
        forked = await source.fork(3, model="passthrough", task_queue=h.task_queue)
        assert texts(await first_turn(h, forked, "three")) == ["one", "one", "two"]
        assert texts(await transcript(forked))[:3] == ["one", "one", "two"]
        # A standalone turn: the history it was given, then its first messages.
        turn = await start_turn(
            h.client,
            TurnInput(agent="test", messages=["b"], history=[Message.user("a")]),
            task_queue=h.task_queue,
        )
        await turn.result()
        from_turn = await turn.fork(1, task_queue=h.task_queue)
        assert texts(await first_turn(h, from_turn, "c")) == ["a", "b"]
        for session in (source, forked, from_turn):
            await session.close()


@pytest.mark.parametrize("storage", ["stored", "held"])
async def test_a_fork_after_a_rewind_is_the_conversation_as_it_stood_at_that_message(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path, storage: str
) -> None:
    """The transcript keeps a rewound turn's messages before the next turn's: a fork at a
    message is the conversation as it stood there, never that mix."""
    if storage == "stored":
        context = harness(agents=AGENT, function_tools=TOOLS)
    else:
        context = _held(temporal, tmp_path)
    async with context as h:
        # Two turns a run: the rewind is read from the state a later run carried over.
        source = await open_session(
            h.client, agent="test", task_queue=h.task_queue, turns_per_run=2
        )
        await talk(source, "a", "b", "c")
        await source.rewind(1)
        await talk(source, "d")
        assert texts(await transcript(source)) == ["a", "a", "b", "b", "c", "c", "d", "d"]
        forks = []
        # Turn 4's messages: turn 1's conversation, then turn 4's up to the message.
        for at, expected in (
            (7, ["a", "a", "d"]),
            (8, ["a", "a", "d", "d"]),
            # A rewound turn's message forks the timeline that was rewound.
            (5, ["a", "a", "b", "b", "c"]),
        ):
            forked = await source.fork(at, task_queue=h.task_queue)
            forks.append(forked)
            assert texts(await first_turn(h, forked, "x")) == expected, at
            assert (await forked.handle.describe()).typed_search_attributes.get(
                visibility.FORK_OF
            ) == f"{source.session_id}@{at}"
        # The turn itself forks the same way.
        turn = get_turn(h.client, f"{source.session_id}/turn-4")
        forked = await turn.fork(1, task_queue=h.task_queue)
        forks.append(forked)
        assert texts(await first_turn(h, forked, "x")) == ["a", "a", "d"]
        with pytest.raises(ForkError, match="has 8 messages"):
            await source.fork(9, task_queue=h.task_queue)
        for session in (source, *forks):
            await session.close()
        # A closed session reads where its turns ended from its result.
        forked = await source.fork(7, task_queue=h.task_queue)
        assert texts(await first_turn(h, forked, "x")) == ["a", "a", "d"]
        await forked.close()


@asynccontextmanager
async def _held(temporal: ServerInfo, tmp_path: Path) -> AsyncIterator[Harness]:
    """A client and a worker without payload storage: sessions hold their conversations."""
    settings = make_settings(tmp_path, agents=AGENT, payload_storage={"driver": "off"})
    client = await connect(temporal.address, temporal.namespace, settings=settings)
    task_queue = f"test-{uuid.uuid4().hex[:10]}"
    async with build_worker(client, settings, function_tools=TOOLS, task_queue=task_queue):
        yield Harness(client, settings, task_queue)


async def test_bad_forks_get_clear_errors(harness: HarnessFactory) -> None:
    async with harness(agents=AGENT, function_tools=TOOLS) as h:
        source = await open_session(h.client, agent="test", task_queue=h.task_queue)
        await talk(source, "one")
        with pytest.raises(ForkError, match="no turn or session 'nope'"):
            await fork(h.client, "nope", at=1)
        with pytest.raises(ForkError, match="counts messages from 1"):
            await source.fork(0)
        with pytest.raises(ForkError, match="has 2 messages: --at must be from 1 to 2; got 3"):
            await source.fork(3)
        # An agent the worker does not know: the fork's turn fails saying so, as any turn.
        forked = await source.fork(1, agent="ghost", task_queue=h.task_queue)
        sent = await forked.send("hello")
        with pytest.raises(WorkflowFailureError) as failed:
            await get_turn(h.client, sent.turn_id).result()
        assert "Unknown agent 'ghost'" in str(failed.value.cause.__cause__)
        await forked.close()
        await source.close()


async def _start(client: Client, h: Harness, session: SessionInput, workflow_id: str) -> str:
    """Start a session as any client may (with no turnkeep client code) and return why it
    failed."""
    handle = await client.start_workflow(
        SESSION_WORKFLOW_NAME, session, id=workflow_id, task_queue=h.task_queue
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    return str(failed.value.cause)


async def test_a_fork_start_is_checked_as_any_start(harness: HarnessFactory) -> None:
    """A client starting a session by hand cannot hand it another session's stored
    conversation, a conversation without saying it forks, or one ending inside a tool batch;
    and a fork carries no state of its source (its rules, its spent budget, its turn count)."""
    async with harness(agents=AGENT, function_tools=TOOLS) as h:
        source = await open_session(h.client, agent="test", task_queue=h.task_queue)
        await talk(source, "one")
        theirs = await source.handle.query("conversation", result_type=ConversationRef)
        origin = ForkOrigin(source=source.session_id, at=2)
        stolen = SessionInput(agent="test", fork=origin, conversation=theirs)
        assert "another session's" in await _start(h.client, h, stolen, f"bad-{uuid.uuid4()}")
        unsaid = SessionInput(agent="test", transcript=[Message.user("hi")])
        assert "only a fork" in await _start(h.client, h, unsaid, f"bad-{uuid.uuid4()}")
        call = Message.model_validate(
            {"role": "assistant", "stop_reason": "toolUse", "tool_calls": {"c1": {"name": "x"}}}
        )
        cut = [*(await transcript(source))[:1], call]
        batch = SessionInput(agent="test", fork=origin, transcript=cut)
        assert "tool calls nobody answered" in await _start(
            h.client, h, batch, f"bad-{uuid.uuid4()}"
        )
        # A fork's first turn is its own turn 1, with no rules or spending handed on.
        forked = await source.fork(2, task_queue=h.task_queue)
        sent = await forked.send("two")
        assert sent.turn == 1
        await source.close()
        await forked.close()


async def test_gc_keeps_a_running_forks_source_segments(
    harness: HarnessFactory, client: Client
) -> None:
    async with harness(agents=AGENT, function_tools=TOOLS) as h:
        source = await open_session(h.client, agent="test", task_queue=h.task_queue)
        await talk(source, "one", "two")
        forked = await source.fork(4, task_queue=h.task_queue)
        await source.close()
        await source.result()
        directory = conversations(h)
        theirs = list((directory / owner_key(source.session_id)).iterdir())
        _age(theirs, days=30)
        retention = timedelta(days=7)

        async def closed_source_listed() -> bool:
            running = {
                e.id
                async for e in client.list_workflows(
                    f"WorkflowId = '{source.session_id}' AND ExecutionStatus = 'Running'"
                )
            }
            return not running

        await eventually(closed_source_listed, "the source is listed as closed")
        await collect(directory.parent, retention, client)
        # The source is closed and unread for 30 days, but a running fork goes on from it.
        assert all(p.exists() for p in theirs)
        assert await talk(forked, "three") == ["three", "three"]
        await forked.close()
        await forked.result()
        _age(list((directory / owner_key(forked.session_id)).iterdir()), days=30)
        _age(theirs, days=30)

        async def swept() -> bool:
            await collect(directory.parent, retention, client)
            return not any(p.exists() for p in theirs)

        await eventually(swept, "both closed, the source's segments were swept")


async def test_the_fork_command(temporal: ServerInfo, client: Client, tmp_path: Path) -> None:
    config = {
        "task_queue": f"fork-{uuid.uuid4().hex[:8]}",
        "agents": {"test": {"model": "passthrough"}},
    }
    (tmp_path / "turnkeep.yaml").write_text(json.dumps(config), encoding="utf-8")
    out = await asyncio.to_thread(chat, temporal, tmp_path, "one\ntwo\n")
    [source] = re.findall(r"^session (session-test-\S+)$", out, re.M)
    fork_args = ("fork", source, "--at", "2", "--message", "again", "--worker")
    fork_args += ("--priority", "batch", "--tenant", "acme")
    done = await asyncio.to_thread(turnkeep, *fork_args, temporal=temporal, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [forked] = re.findall(
        rf"^session (\S+) · forked from {source} at message 2$", done.stdout, re.M
    )
    assert "again" in done.stdout and f"turnkeep chat --session {forked}" in done.stdout
    turn = await get_turn(client, f"{forked}/turn-1").result()
    assert texts(turn.history) == ["one", "one", "again", "again"]
    view = await read_turn(client, f"{forked}/turn-1")
    assert (view.priority, view.tenant) == ("batch", "acme")
    # Mistakes, in one line each, with nothing started.
    for args, said in [
        (["nope", "--at", "1"], "no turn or session 'nope' to fork"),
        ([source, "--at", "9"], "--at must be from 1 to 4; got 9"),
        ([source, "--at", "1", "--agent", "ghost"], "no agent 'ghost'"),
        ([source, "--at", "1", "--model", "nonesuch.model"], "nothing was started"),
        ([source, "--at", "1", "--priority", "urgent"], "--priority': 'urgent' is not one of"),
        ([source, "--at", "1", "--tenant", "a b"], "invalid value for --tenant: String should"),
    ]:
        done = await asyncio.to_thread(turnkeep, "fork", *args, temporal=temporal, cwd=tmp_path)
        assert done.returncode != 0 and said in done.stderr, (args, done.stderr)
    for session_id in (source, forked):
        await get_session(client, session_id).handle.terminate()


async def test_the_gateway_forks_turns_and_sessions_for_keys_that_reach_both_agents(
    harness: HarnessFactory,
) -> None:
    """A key scoped to agents forks only a source of an agent it reaches, into an agent it
    reaches; bad requests get one-line errors."""
    async with harness(TOOLS, **PASSTHROUGH) as h, gateway(h) as http:
        source = await open_session(h.client, agent="test", task_queue=h.task_queue)
        await talk(source, "one", "two")
        base = f"/api/sessions/{source.session_id}/fork"
        # `reader` reaches `test` only: not into `other`; `other` cannot read a `test` session.
        into_other = {"at": 2, "agent": "other"}
        denied = await http.post(base, json=into_other, headers=bearer(READER))
        assert denied.status_code == 403 and "agent 'other'" in denied.json()["error"]
        denied = await http.post(base, json={"at": 2}, headers=bearer(OTHER))
        assert denied.status_code == 403
        for body, status, said in [
            ({"at": 0}, 422, "at"),
            ({"at": 9}, 409, "must be from 1 to 4; got 9"),
            ({"at": 1, "agent": "ghost"}, 404, "no agent named 'ghost'"),
            ({"at": 1, "history": []}, 422, "history"),
        ]:
            answer = await http.post(base, json=body, headers=bearer(READER))
            assert answer.status_code == status and said in answer.json()["error"], answer.text
        missing = await http.post("/api/sessions/nope/fork", json={"at": 1}, headers=bearer(ADMIN))
        assert missing.status_code == 404
        # Allowed: a session's fork, with a message, and a turn's.
        made = await http.post(base, json={"at": 3, "text": "three"}, headers=bearer(READER))
        assert made.status_code == 201, made.text
        assert made.json()["fork_of"] == f"{source.session_id}@3"
        forked = get_session(h.client, made.json()["session_id"])
        assert texts([m async for m in forked.messages(0, until_turn=1)])[:3] == [
            "one",
            "one",
            "two",
        ]
        turn_fork = await http.post(
            f"/api/turns/{source.session_id}/turn-2/fork",
            json={"at": 1, "agent": "other"},
            headers=bearer(ADMIN),
        )
        assert turn_fork.status_code == 201, turn_fork.text
        assert turn_fork.json()["fork_of"] == f"{source.session_id}/turn-2@1"
        for session_id in (source.session_id, made.json()["session_id"]):
            await get_session(h.client, session_id).close()


async def test_a_fork_of_an_encrypted_conversation_stays_encrypted(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    store = tmp_path / "payloads"
    settings = make_settings(
        tmp_path,
        agents={"test": {"model": "passthrough"}},
        encryption=encryption("k1", k1=new_key()),
        payload_storage={"path": str(store)},
    )
    async with worker_for(temporal, settings) as h:
        source = await open_session(h.client, agent="test", task_queue=h.task_queue)
        secret = f"secret-otter-{uuid.uuid4().hex}"
        await talk(source, secret, "two")
        # A cut mid-turn: the fork's own segment holds a message of the source's.
        forked = await source.fork(3, task_queue=h.task_queue)
        assert texts(await first_turn(h, forked, "more"))[:3] == [secret, secret, "two"]
        mine = conversations(h) / owner_key(forked.session_id)
        files = [p for p in mine.iterdir() if p.name != "forked-from"]
        assert files and not any(b"two" in p.read_bytes() for p in files)
        assert not any(secret.encode() in p.read_bytes() for p in store.rglob("*") if p.is_file())
        for session in (source, forked):
            await session.close()
