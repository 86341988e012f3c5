"""Rewinding a session (``SessionHandle.rewind``, ``SessionWorkflow``'s ``rewind`` update,
``turnkeep rewind``): the next turn sees the conversation as it was once turn N had ended,
the rewound turns stay for the audit, and the session says who rewound it and when. The
passthrough model echoes the last user message, so each turn's history shows what the session
handed it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowUpdateFailedError

from tests.conftest import Harness, HarnessFactory, eventually, make_settings, turnkeep
from tests.test_always_allow import _agent, _asks, _waits
from tests.test_conversations import _age, conversations
from tests.test_gateway import OTHER, PASSTHROUGH, READER, bearer, gateway
from tests.test_sessions import AGENT, SLOW_CALL, blocked, gate, open_on, texts
from turnkeep.client.connection import connect
from turnkeep.client.history import read_turn
from turnkeep.client.sessions import (
    SessionClosedError,
    SessionHandle,
    read_session,
)
from turnkeep.client.turns import get_turn
from turnkeep.contract.messages import Message
from turnkeep.contract.rewind import REWIND_UPDATE, RewindRequest, TurnMark
from turnkeep.contract.session_io import SessionState
from turnkeep.contract.turn_io import Spent
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.payloads.gc import collect
from turnkeep.payloads.storage.owners import owner_key
from turnkeep.testing import environment
from turnkeep.testing.fake_api import Reply
from turnkeep.testing.fake_model import FakeModel
from turnkeep.worker.build import build_worker
from turnkeep.workflows.session_rewind import forget_history_ends, rewind, rewind_problem

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def _reset() -> None:
    gate.clear()


async def talk(session: SessionHandle, *lines: str) -> int:
    """Send each line and wait for its turn to end; the last turn's number."""
    turn = 0
    for line in lines:
        sent = await session.send(line)
        async for _ in session.messages((await session.progress()).count, until_turn=sent.turn):
            pass
        turn = sent.turn
    return turn


async def details(session: SessionHandle) -> str:
    """The session's current details, read the way the Web UI reads them."""
    metadata = await session.handle.query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return metadata.current_details


async def history_of(h: Harness, session: SessionHandle, turn: int) -> list[str]:
    result = await get_turn(h.client, f"{session.session_id}/turn-{turn}").result()
    return texts(result.history)


@asynccontextmanager
async def held(temporal: ServerInfo, tmp_path: Path) -> AsyncIterator[Harness]:
    """A client and a worker without payload storage: the session holds its conversation
    itself (the `client` fixture has the default storage)."""
    settings = make_settings(tmp_path, agents=AGENT, payload_storage={"driver": "off"})
    client = await connect(temporal.address, temporal.namespace, settings=settings)
    task_queue = f"test-{uuid.uuid4().hex[:10]}"
    tools = {"local": [blocked]}
    async with build_worker(client, settings, function_tools=tools, task_queue=task_queue):
        yield Harness(client, settings, task_queue)


def stored_or_held(
    storage: str, harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> Any:
    """A harness with payload storage (``stored``) or without (``held``)."""
    if storage == "stored":
        return harness(agents=AGENT, function_tools={"local": [blocked]})
    return held(temporal, tmp_path)


@pytest.mark.parametrize("storage", ["stored", "held"])
async def test_the_next_turn_sees_the_conversation_of_turn_n(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path, storage: str
) -> None:
    async with stored_or_held(storage, harness, temporal, tmp_path) as h:
        session = await open_on(h)
        await talk(session, "a", "b", "c")
        rewind = await session.rewind(1, by="alice")
        assert (rewind.to_turn, rewind.from_turn, rewind.by, rewind.turns) == (1, 3, "alice", 3)
        assert rewind.at_message == 6
        # Numbers go on counting: turn 4, never a rewound turn's id.
        assert await talk(session, "d") == 4
        assert await history_of(h, session, 4) == ["a", "a", "d", "d"]
        # The transcript keeps every message, the rewound turns' too: indices stay valid.
        transcript = texts([m async for m in session.transcript()])
        assert transcript == ["a", "a", "b", "b", "c", "c", "d", "d"]
        # The rewound turns' workflows stay, for the audit.
        assert await history_of(h, session, 3) == ["a", "a", "b", "b", "c", "c"]
        assert [r.by for r in await session.rewinds()] == ["alice"]
        # The Web UI's details for the session say so too.
        assert "rewound from turn 3 to turn 1 by alice" in await details(session)
        view = await read_session(h.client, session.session_id)
        assert view is not None and len(view.turns) == 4 and view.rewinds == [rewind]
        await session.close()
        assert (await session.result()).rewinds == [rewind]
        assert await session.rewinds() == [rewind]


async def test_a_fork_rewound_to_zero_goes_back_to_what_it_was_forked_with(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    for storage in ("stored", "held"):
        await _fork_rewound_to_zero(stored_or_held(storage, harness, temporal, tmp_path))


async def _fork_rewound_to_zero(context: Any) -> None:
    async with context as h:
        source = await open_on(h)
        await talk(source, "a", "b")
        before = texts([m async for m in source.transcript()])
        forked = await source.fork(4, task_queue=h.task_queue)
        await talk(forked, "c", "d")
        await forked.rewind(0, by="bob")
        assert await talk(forked, "e", "f") == 4
        assert await history_of(h, forked, 3) == ["a", "a", "b", "b", "e", "e"]
        # To a turn after it, then back to 0 again: each a conversation the fork had.
        await forked.rewind(3)
        assert await talk(forked, "g") == 5
        assert await history_of(h, forked, 5) == ["a", "a", "b", "b", "e", "e", "g", "g"]
        await forked.rewind(0)
        with pytest.raises(WorkflowUpdateFailedError):
            await forked.rewind(0)  # at turn 0 already
        assert await talk(forked, "h") == 6
        assert await history_of(h, forked, 6) == ["a", "a", "b", "b", "h", "h"]
        # The source is untouched, and goes on from its own conversation.
        assert texts([m async for m in source.transcript()]) == before
        assert await talk(source, "z") == 3
        assert await history_of(h, source, 3) == ["a", "a", "b", "b", "z", "z"]
        await forked.close()
        await source.close()


async def test_rewind_to_zero_twice_and_across_continue_as_new(harness: HarnessFactory) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        # Two turns a run: every rewind here crosses a run's boundary one way or the other.
        session = await open_on(h, turns_per_run=2)
        first_run = (await session.handle.describe()).run_id
        await talk(session, "a", "b", "c")
        assert (await session.handle.describe()).run_id != first_run
        await session.rewind(0)
        assert await talk(session, "d") == 4
        assert await history_of(h, session, 4) == ["d", "d"]
        await talk(session, "e", "f")  # turns 5 and 6
        # Back to turn 4, from a later run: its conversation comes from the stored chain.
        await session.rewind(4)
        await talk(session, "g")
        assert await history_of(h, session, 7) == ["d", "d", "g", "g"]
        # Twice in a row, with no turn between: back to turn 7, then to 4 again.
        await talk(session, "h")
        await session.rewind(7)
        await session.rewind(4)
        await talk(session, "i")
        assert await history_of(h, session, 9) == ["d", "d", "i", "i"]
        rewinds = await session.rewinds()
        assert [(r.from_turn, r.to_turn) for r in rewinds] == [(3, 0), (6, 4), (8, 7), (7, 4)]
        # A run continued after the rewinds still lists them in its details, the last first.
        assert "rewound from turn 8 to turn 7" in (await details(session)).split("from turn 6")[0]
        transcript = texts([m async for m in session.transcript()])
        assert transcript == [t for x in "abcdefghi" for t in (x, x)]
        await session.close()
        assert (await session.result()).turns == 9


async def test_bad_rewinds_are_refused_and_the_session_goes_on(harness: HarnessFactory) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h)
        await talk(session, "a", "b", "c")

        async def refused(to_turn: Any) -> str:
            with pytest.raises(WorkflowUpdateFailedError) as err:
                await session.handle.execute_update(REWIND_UPDATE, {"to_turn": to_turn})
            return str(err.value.cause)

        assert "turn 5 is not one of this session's ended turns; its last is turn 3" in (
            await refused(5)
        )
        assert "greater than or equal to 0" in await refused(-1)
        assert "at turn 3 already" in await refused(3)
        with pytest.raises(WorkflowUpdateFailedError) as err:
            await session.handle.execute_update(REWIND_UPDATE, args=[1, 2])
        assert "rewind takes one argument, a RewindRequest" in str(err.value.cause)
        with pytest.raises(ValidationError):
            await session.rewind(-1)
        await session.rewind(1)
        assert "turn 2 was itself rewound from turn 3 to turn 1" in await refused(2)
        assert "at turn 1 already" in await refused(1)

        # While a turn runs (and a message waits for the next): refused, saying what to do.
        sent = await session.send(SLOW_CALL)
        await session.send("queued")
        message = await refused(0)
        assert f"turn {sent.turn} is running: a rewind would race with it" in message
        assert "Cancel the running turn first" in message
        # Asked to, the rewind cancels the running turn, then the one answering the queued
        # message, and goes back.
        rewind = await session.rewind(0, cancel_running=True)
        assert rewind.from_turn >= sent.turn and rewind.to_turn == 0
        gate.set()
        last = await talk(session, "z")
        assert await history_of(h, session, last) == ["z", "z"]
        await session.close()
        await session.result()
        with pytest.raises(SessionClosedError):
            await session.rewind(0)


async def test_turnkeep_rewind_and_show(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h)
        await talk(session, "a", "b")
        done = await asyncio.to_thread(
            turnkeep,
            "rewind",
            session.session_id,
            "--to-turn",
            "1",
            temporal=temporal,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        assert f"rewound session {session.session_id} from turn 2 to turn 1" in done.stdout
        await talk(session, "c")
        shown = await asyncio.to_thread(
            turnkeep, "show", session.session_id, temporal=temporal, cwd=tmp_path
        )
        assert shown.returncode == 0, shown.stderr
        out = " ".join(shown.stdout.split())
        assert "turn 2 was rewound from turn 2 to turn 1" in out
        assert out.index("session rewound from turn 2 to turn 1") < out.index("turn-3")
        again = await asyncio.to_thread(
            turnkeep,
            "rewind",
            session.session_id,
            "--to-turn",
            "9",
            temporal=temporal,
            cwd=tmp_path,
        )
        assert again.returncode != 0
        assert "turn 9 is not one of this session's ended turns" in again.stderr


async def test_the_gateway_rewinds_a_session_its_key_may_reach(harness: HarnessFactory) -> None:
    async with (
        harness({"local": [blocked]}, **PASSTHROUGH) as h,
        gateway(h) as http,
    ):
        session = await open_on(h)
        await talk(session, "a", "b")
        path = f"/api/sessions/{session.session_id}/rewind"
        # A key scoped to another agent does not reach the session; the body is checked.
        assert (
            await http.post(path, json={"to_turn": 1}, headers=bearer(OTHER))
        ).status_code == 403
        bad = await http.post(path, json={"to_turn": -1}, headers=bearer(READER))
        assert bad.status_code == 422, bad.text
        unknown = await http.post(path, json={"turn": 1}, headers=bearer(READER))
        assert unknown.status_code == 422, unknown.text
        refused = await http.post(path, json={"to_turn": 7}, headers=bearer(READER))
        assert refused.status_code == 409
        assert "turn 7 is not one of this session's ended turns" in refused.json()["error"]
        done = await http.post(path, json={"to_turn": 1}, headers=bearer(READER))
        assert done.status_code == 200, done.text
        body = done.json()
        assert (body["from_turn"], body["to_turn"], body["by"]) == (1 + 1, 1, "gateway key reader")
        assert await talk(session, "c") == 3
        assert await history_of(h, session, 3) == ["a", "a", "c", "c"]
        await session.close()
        await session.result()
        ended = await http.post(path, json={"to_turn": 0}, headers=bearer(READER))
        assert ended.status_code == 409 and "has ended" in ended.json()["error"]


async def test_rules_set_by_rewound_turns_are_revoked(
    client: Client, fake_model: FakeModel
) -> None:
    fake_model.script(
        "app",
        Reply.text("1"),
        _asks("w2", "two"),
        Reply.text("2"),
        _asks("w3", "three"),
        Reply.text("3"),
    )
    async with environment.harness(client, agents=[_agent(fake_model)], fake=fake_model) as h:
        session = await h.session(agent="app")
        await talk(session, "first")
        sent = await session.send("second")
        turn = get_turn(h.client, sent.turn_id)
        await eventually(lambda: _waits(turn, "w2"), "w2 waits")
        record = await turn.decide("w2", True, by="alice", remember="session")
        await turn.result()

        async def joined() -> bool:  # once the session has taken the ended turn in
            return [r.id for r in await session.allow_rules()] == [record.rule]

        await eventually(joined, "the rule joins the session")
        await session.rewind(1, by="bob")
        # The rule turn 2 set went with it: the same call waits for a person again.
        assert await session.allow_rules() == []
        [rule] = await session.allow_rules(include_revoked=True)
        assert (rule.id, rule.revoked_by) == (record.rule, "rewind:bob")
        third = await session.send("third")
        turn = get_turn(h.client, third.turn_id)
        await eventually(lambda: _waits(turn, "w3"), "w3 waits despite the rewound rule")
        await turn.decide("w3", True, by="alice")
        await turn.result()
        await session.close()


def _state(**fields: Any) -> SessionState:
    return SessionState(
        history=[Message.user("a"), Message.assistant("a"), Message.user("b")],
        turns=2,
        turn_ends={1: 2, 2: 3},
        turn_marks={1: TurnMark(history_end=2), 2: TurnMark(history_end=3)},
        **fields,
    )


async def test_money_spent_stays_spent_and_tokens_stay_counted() -> None:
    spent = Spent(usd=1.5, tokens=1000)
    state = _state(spent=spent, tokens=1234)
    request = RewindRequest(to_turn=0, by="x")
    assert rewind_problem(state, request, busy=None) is None
    record = rewind(state, request, owner="s", now=datetime.now(UTC))
    assert state.history == [] and (record.from_turn, record.to_turn) == (2, 0)
    assert state.spent == spent and state.tokens == 1234


async def test_a_compaction_leaves_nothing_before_it_to_go_back_to() -> None:
    state = _state()
    forget_history_ends(state)
    state.turn_marks[2] = TurnMark(history_end=1)
    problem = rewind_problem(state, RewindRequest(to_turn=1), busy=None)
    assert problem is not None and "compacted since" in problem
    # The empty conversation is always there to go back to.
    assert rewind_problem(state, RewindRequest(to_turn=0), busy=None) is None


async def test_a_rewind_copies_nothing_and_gc_keeps_every_turns_segments(
    harness: HarnessFactory, client: Client
) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h)
        await talk(session, "a", "b", "c")
        directory = conversations(h) / owner_key(session.session_id)
        before = sorted(directory.iterdir())
        await session.rewind(1)
        # By reference: the session points back at turn 1's segment, and stores nothing new.
        assert sorted(directory.iterdir()) == before
        await talk(session, "d")
        segments = list(directory.iterdir())
        _age(segments, days=30)
        report = await collect(directory.parent.parent, timedelta(days=7), client)
        assert not any(p in report.removed for p in segments)
        assert all(p.exists() for p in segments)
        # What the audit reads is all there: the rewound turn, and the session's every turn.
        rewound = await read_turn(h.client, f"{session.session_id}/turn-3")
        assert rewound.result is not None
        assert texts(rewound.result.history) == ["a", "a", "b", "b", "c", "c"]
        view = await read_session(h.client, session.session_id)
        assert view is not None and len(view.turns) == 4
        # And the session goes on from the rewound conversation, read back from the store.
        await talk(session, "e")
        assert await history_of(h, session, 5) == ["a", "a", "d", "d", "e", "e"]
        await session.close()
