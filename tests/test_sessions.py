"""Sessions (``SessionWorkflow``, ``turnkeep.open_session``): a conversation as one durable
workflow whose turns are child ``TurnWorkflow``s, against the real dev server. The
passthrough model echoes the last user message, so each answer says which prompt it answers
and each turn's history shows what the session carried."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError

from tests.conftest import Harness, HarnessFactory, eventually, turnkeep
from turnkeep import open_session
from turnkeep.client.live import MessageEvent
from turnkeep.client.sessions import SessionClosedError, SessionHandle, get_session, read_session
from turnkeep.client.turns import get_turn
from turnkeep.contract.messages import Message
from turnkeep.contract.turn_io import HistoryChange, TurnCancelledError
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio

gate = asyncio.Event()
started: list[str] = []


async def blocked(name: str) -> str:
    """A slow tool: runs until the test opens the gate."""
    started.append(name)
    await gate.wait()
    return f"{name} passed"


SLOW_CALL = '***CALL_TOOL local__blocked {"name": "slow"}'
AGENT = {"test": {"model": "passthrough", "servers": ["local"]}}


@pytest.fixture(autouse=True)
def _reset() -> None:
    gate.clear()
    started.clear()


async def open_on(h: Harness, **kwargs: Any) -> SessionHandle:
    return await open_session(h.client, agent="test", task_queue=h.task_queue, **kwargs)


async def collect(session: SessionHandle, start: int = 0, **kwargs: Any) -> list[Message]:
    return [m async for m in session.messages(start, **kwargs)]


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


async def test_sends_are_answered_in_order_with_the_conversation_carried(
    harness: HarnessFactory,
) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h)
        first = await session.send("first")
        assert first.turn_id == f"{session.session_id}/turn-1" and not first.queued
        assert texts(await collect(session, until_turn=first.turn)) == ["first", "first"]
        second = await session.send("second")
        assert second.turn_id == f"{session.session_id}/turn-2"
        # Following from index 2 gives the second turn only.
        assert texts(await collect(session, 2, until_turn=second.turn)) == ["second", "second"]
        # The second turn, a workflow of its own, was given the first as its history.
        turn = await get_turn(h.client, second.turn_id).result()
        assert texts(turn.history) == ["first", "first", "second", "second"]
        await session.close()
        closed = await session.result()
        assert texts(closed.transcript) == ["first", "first", "second", "second"]
        assert closed.turns == 2
        # A closed session stays readable, and a follower of it reads to the end and stops.
        assert texts(await collect(session, 1)) == ["first", "second", "second"]


async def test_messages_sent_during_a_turn_are_answered_together_next(
    harness: HarnessFactory,
) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h)
        slow = await session.send(SLOW_CALL)
        await eventually(lambda: started, "the slow tool ran")
        a = await session.send("a")
        b = await session.send("b")
        # Both wait for the running turn, and are answered by the same next turn.
        assert a.queued and b.queued and a.turn_id == b.turn_id == f"{session.session_id}/turn-2"
        follower = asyncio.create_task(collect(session, until_turn=b.turn))
        gate.set()
        messages = await follower
        # Passthrough echoes the user messages after the last answer: both, in one answer.
        assert texts(messages)[-3:] == ["a", "b", "a\nb"]
        assert messages[0].text == SLOW_CALL and slow.turn == 1
        next_turn = await get_turn(h.client, b.turn_id).result()
        assert texts(next_turn.messages) == ["a", "b", "a\nb"]


async def test_a_cancelled_turn_is_repaired_and_the_session_goes_on(
    harness: HarnessFactory,
) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h)
        await session.send(SLOW_CALL)
        await eventually(lambda: started, "the slow tool ran")
        assert await session.cancel_turn()
        after = await session.send("still here?")
        messages = await collect(session, until_turn=after.turn)
        # The repaired conversation was kept: the interrupted call has its marker answer.
        [repair] = [m for m in messages if m.tool_results]
        assert repair.tool_results
        [result] = repair.tool_results.values()
        assert result.is_error and result.text == INTERRUPTED_TEXT
        assert texts(messages)[-2:] == ["still here?", "still here?"], [
            (m.role, m.text[:20], list(m.tool_results or {}), list(m.tool_calls or {}))
            for m in messages
        ]
        turn = await get_turn(h.client, after.turn_id).result()
        assert turn.history[: len(messages) - 2] == messages[:-2]


async def test_interrupt_cancels_the_running_turn_and_answers_everything_queued(
    harness: HarnessFactory,
) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h, on_new_message="interrupt")
        slow = await session.send(SLOW_CALL)
        await eventually(lambda: started, "the slow tool ran")
        sent = await session.send("stop that")
        assert sent.queued and sent.turn == 2
        # The gate stays shut: only the interrupt can end the slow turn.
        messages = await collect(session, until_turn=sent.turn)
        with pytest.raises(TurnCancelledError):
            await get_turn(h.client, slow.turn_id).result()
        # The repaired conversation was kept, and the next turn answered the new message.
        [repair] = [m for m in messages if m.tool_results]
        [result] = (repair.tool_results or {}).values()
        assert result.is_error and result.text == INTERRUPTED_TEXT
        assert texts(messages)[-2:] == ["stop that", "stop that"]
        turn = await get_turn(h.client, sent.turn_id).result()
        assert turn.history[: len(messages) - 2] == messages[:-2]
        assert started == ["slow"]


async def test_show_prints_a_session_open_and_closed(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h)
        for prompt in ("first question", "second question"):
            sent = await session.send(prompt)
            await collect(session, until_turn=sent.turn)
        shown = await asyncio.to_thread(
            turnkeep, "show", session.session_id, temporal=temporal, cwd=tmp_path
        )
        assert shown.returncode == 0, shown.stderr
        out = shown.stdout
        # The word `sessions` uses for it too.
        assert f"session {session.session_id} · open · 2 turns" in out
        assert out.index(f"turn {session.session_id}/turn-1") < out.index("first question")
        assert out.index("first question") < out.index(f"turn {session.session_id}/turn-2")
        assert out.index(f"turn {session.session_id}/turn-2") < out.index("second question")
        await session.close()
        await session.result()
    # Closed, with no worker left: still readable, also as JSON.
    shown = await asyncio.to_thread(
        turnkeep, "show", session.session_id, "--json", temporal=temporal, cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["status"] == "closed"
    assert [t["workflow_id"] for t in view["turns"]] == [
        f"{session.session_id}/turn-1",
        f"{session.session_id}/turn-2",
    ]
    assert [m["content"][0]["text"] for m in view["turns"][1]["result"]["messages"]] == [
        "second question",
        "second question",
    ]


async def test_bad_sends_are_refused_and_the_session_goes_on(harness: HarnessFactory) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h)
        bad: list[tuple[Any, str]] = [
            ("   ", "empty"),
            (42, "send takes one argument"),
            ({"role": "assistant", "content": []}, "user messages only"),
            ({"role": "user", "content": "nope"}, "not a Message"),
        ]
        for arg, says in bad:
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await session.handle.execute_update("send", arg)
            assert says in str(refused.value.cause)
        with pytest.raises(WorkflowUpdateFailedError):
            await session.handle.execute_update("send", args=["a", "b"])
        with pytest.raises(WorkflowUpdateFailedError):
            await session.handle.execute_update("wait_for_messages", True)
        sent = await session.send(Message.user("fine"))
        assert texts(await collect(session, until_turn=sent.turn)) == ["fine", "fine"]
        await session.close()
        with pytest.raises(SessionClosedError):
            await session.send("too late")
        assert (await session.result()).turns == 1
        # Its id is not reused for an empty session.
        with pytest.raises(SessionClosedError):
            await open_on(h, session_id=session.session_id)


async def test_a_workflow_holding_the_next_turns_id_does_not_stop_the_session(
    harness: HarnessFactory,
) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h)
        first = await session.send("first")
        await collect(session, until_turn=first.turn)
        # Any client may start a workflow under the id the next turn would get; on a task
        # queue no worker polls, it stays running.
        squatter = await h.client.start_workflow(
            "Squatter", id=f"{session.session_id}/turn-2", task_queue=f"nobody-{uuid.uuid4()}"
        )
        try:
            second = await session.send("second")
            assert second.turn_id == f"{session.session_id}/turn-3" and second.turn == 3
            assert texts(await collect(session, 2, until_turn=second.turn)) == ["second"] * 2
            turn = await get_turn(h.client, second.turn_id).result()
            assert texts(turn.history) == ["first", "first", "second", "second"]
            # `turnkeep show SESSION` shows the session's own turns only.
            view = await read_session(h.client, session.session_id)
            assert view is not None
            assert [t.workflow_id for t in view.turns] == [first.turn_id, second.turn_id]
        finally:
            await squatter.terminate()
        await session.close()
        assert texts((await session.result()).transcript) == ["first", "first", "second", "second"]


async def test_continue_as_new_keeps_the_conversation(harness: HarnessFactory) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h, turns_per_run=2)
        first_run = (await session.handle.describe()).run_id
        for n in range(5):
            sent = await session.send(f"m{n}")
            await collect(session, 2 * n, until_turn=sent.turn)
        # Five turns, two per run: the session is on its third run, with the whole
        # conversation, and a follower from index 0 gets every message across runs.
        assert (await session.handle.describe()).run_id != first_run
        everything = await collect(session, until_turn=5)
        assert texts(everything) == [t for n in range(5) for t in (f"m{n}", f"m{n}")]
        last = await get_turn(h.client, f"{session.session_id}/turn-5").result()
        assert len(last.history) == 10
        await session.close()
        assert (await session.result()).turns == 5


async def streamed(session: SessionHandle, start: int = 0, **kwargs: Any) -> list[Message]:
    return [e.message async for e in session.stream(start, **kwargs) if isinstance(e, MessageEvent)]


async def test_messages_until_a_turn_stop_at_its_end_whatever_came_after(
    harness: HarnessFactory,
) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h, turns_per_run=2)
        for n in (1, 2, 3):
            sent = await session.send(f"m{n}")
            await collect(session, 2 * (n - 1), until_turn=sent.turn)
        # Turn 3 has ended, on the session's second run: a follower until turn 1 or 2 gets
        # exactly the messages up to that turn's end.
        assert texts(await collect(session, until_turn=1)) == ["m1", "m1"]
        assert texts(await collect(session, 2, until_turn=2)) == ["m2", "m2"]
        assert texts(await streamed(session, until_turn=2)) == ["m1", "m1", "m2", "m2"]
        # Turn 4 runs (its tool waits for the gate): a follower until turn 3 stops at turn
        # 3's end instead of following turn 4. Bounded, so following it fails, not hangs.
        slow = await session.send(SLOW_CALL)
        await eventually(lambda: started, "the slow tool ran")
        first_three = ["m1", "m1", "m2", "m2", "m3", "m3"]
        assert texts(await asyncio.wait_for(collect(session, until_turn=3), 60)) == first_three
        assert texts(await asyncio.wait_for(streamed(session, 4, until_turn=3), 60)) == ["m3"] * 2
        gate.set()
        assert texts(await collect(session, 6, until_turn=slow.turn))[0] == SLOW_CALL
        await session.close()
        await session.result()
        # A closed session's followers stop at the turn asked for too.
        assert texts(await collect(session, until_turn=2)) == first_three[:4]
        assert texts(await streamed(session, 2, until_turn=3)) == first_three[2:]


async def test_an_idle_session_closes_itself(harness: HarnessFactory) -> None:
    async with harness(agents=AGENT, function_tools={"local": [blocked]}) as h:
        session = await open_on(h, idle_timeout=1)
        sent = await session.send("hi")
        await collect(session, until_turn=sent.turn)
        result = await session.result()
        assert texts(result.transcript) == ["hi", "hi"]
        described = await session.handle.describe()
        assert described.status == WorkflowExecutionStatus.COMPLETED


def chat(temporal: ServerInfo, cwd: Path, lines: str, *args: str) -> str:
    """`turnkeep chat` with ``lines`` typed in, as a user would; its output."""
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.address, "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "turnkeep.cli", "chat", "--agent", "test", "--worker", *args],
        input=lines,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_chat_answers_each_line_and_resumes(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    config = {
        "task_queue": f"chat-{uuid.uuid4().hex[:8]}",
        "agents": {"test": {"model": "passthrough"}},
    }
    (tmp_path / "turnkeep.yaml").write_text(json.dumps(config), encoding="utf-8")
    out = await asyncio.to_thread(chat, temporal, tmp_path, "hello there\n\nand again\n")
    [session_id] = re.findall(r"^session (session-test-\S+)$", out, re.M)
    # Each answer (the echo; typed lines are not printed back) after the one before.
    assert out.index("hello there") < out.index("and again")
    # A later chat resumes the session: its turn has the earlier two as history.
    out = await asyncio.to_thread(chat, temporal, tmp_path, "once more\n", "--session", session_id)
    assert "once more" in out
    third = await get_turn(client, f"{session_id}/turn-3").result()
    assert texts(third.history) == [
        "hello there",
        "hello there",
        "and again",
        "and again",
        "once more",
        "once more",
    ]
    # No worker is left to run its close: end it by hand.
    await get_session(client, session_id).handle.terminate()


async def test_a_session_input_bounds_what_a_client_may_ask_for() -> None:
    # Any client may start a session: a run may not be asked to hold a billion turns.
    from pydantic import ValidationError

    from turnkeep.contract.session_io import SessionInput

    assert SessionInput.model_validate({"agent": "a", "turns_per_run": 1_000}).turns_per_run
    with pytest.raises(ValidationError, match="turns_per_run"):
        SessionInput.model_validate({"agent": "a", "turns_per_run": 10**9})


async def test_an_agent_without_history_gets_no_conversation_in_a_session(
    harness: HarnessFactory,
) -> None:
    agents = {"test": {"model": "passthrough", "use_history": False}}
    async with harness(agents=agents) as h:
        session = await open_on(h)
        for prompt in ("first", "second"):
            sent = await session.send(prompt)
            await collect(session, until_turn=sent.turn)
        second = await get_turn(h.client, sent.turn_id).result()
        await session.close()
        closed = await session.result()
    assert second.history == [] and closed.history == []
    assert second.history_change == HistoryChange.UNCHANGED
    assert texts(closed.transcript) == ["first", "first", "second", "second"]
