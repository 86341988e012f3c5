"""Mid-turn compaction (the documentation's *Compaction*) on the real server: success, skip,
failure, and a cancel while it runs — with the summary written by a real SDK against the fake
provider."""

from __future__ import annotations

import json
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from tests.conftest import HarnessFactory, eventually
from turnkeep import open_session
from turnkeep.client.turns import get_turn
from turnkeep.contract.turn_io import HistoryChange, RollbackState, TurnCancelledError
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.workflows.loop import SUMMARY_PREFIX

pytestmark = pytest.mark.asyncio

KEY = "sk-compaction-test"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = {"math": [add]}


def config(fake: FakeModelApi, **compaction: Any) -> dict[str, Any]:
    # A tiny window: the context passes the threshold from the first follow-up call on.
    settings = {"context_window": 10, "threshold": 0.5, "keep_exchanges": 0, **compaction}
    return {
        "anthropic": {"api_key": KEY, "base_url": fake.base_url_anthropic},
        "agents": {
            "test": {
                "model": "anthropic.test-model",
                "servers": ["math"],
                "compaction": settings,
                "llm_timeouts": {"start_to_close": 120, "heartbeat": 5, "max_attempts": 2},
            }
        },
    }


def two_tool_rounds() -> list[Any]:
    return [
        Reply.tool_calls(("c1", "math__add", {"a": 1, "b": 2})),
        Reply.tool_calls(("c2", "math__add", {"a": 3, "b": 4})),
    ]


def activities(history: WorkflowHistory, event: EventType.ValueType) -> list[str]:
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    if event == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return list(scheduled.values())
    return [
        scheduled[e.activity_task_failed_event_attributes.scheduled_event_id]
        for e in history.events
        if e.event_type == event
    ]


async def test_compaction_replaces_older_exchanges_with_the_models_summary(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        *two_tool_rounds(),
        Reply.text("The user wants 1+2 (got 3)."),  # the summary call
        Reply.text("Done: 3 and 7."),
        api="anthropic",
    )
    async with harness(TOOLS, **config(fake)) as h:
        handle = await h.start("Add 1+2, then 3+4.")
        result = await handle.result()
        history = await handle.handle.fetch_history()

    summary_request, final_request = fake.requests_for("anthropic")[2:]
    assert "Summarise this conversation" in json.dumps(summary_request.body)
    assert "Add 1+2, then 3+4." in json.dumps(summary_request.body)  # the older part went in
    # What the model saw next: the summary, then the pending exchange, nothing older.
    sent = final_request.body["messages"]
    assert sent[0]["content"][0]["text"] == SUMMARY_PREFIX + "The user wants 1+2 (got 3)."
    assert "Add 1+2, then 3+4." not in json.dumps(sent)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]

    assert result.history[0].text == SUMMARY_PREFIX + "The user wants 1+2 (got 3)."
    assert result.history_change == HistoryChange.COMPACTED
    assert result.history[1:] == result.messages[3:]  # the kept tail, then the final answer
    assert len(result.messages) == 6  # the turn's own record keeps everything
    assert result.final is not None and result.final.text == "Done: 3 and 7."
    assert (
        activities(history, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED).count("compact_history")
        == 1
    )


async def test_no_compaction_below_the_threshold(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(*two_tool_rounds(), Reply.text("Done."), api="anthropic")
    async with harness(TOOLS, **config(fake, context_window=200_000)) as h:
        handle = await h.start("Add things.")
        result = await handle.result()
        history = await handle.handle.fetch_history()
    assert "compact_history" not in activities(
        history, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    )
    assert result.history == result.messages
    assert len(fake.requests_for("anthropic")) == 3


async def test_failed_compaction_leaves_history_unchanged_and_the_loop_running(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        *two_tool_rounds(),
        Reply.error(400, "summaries are not allowed today"),
        Reply.text("Done anyway."),
        api="anthropic",
    )
    async with harness(TOOLS, **config(fake)) as h:
        handle = await h.start("Add things.")
        result = await handle.result()
        history = await handle.handle.fetch_history()
    assert result.final is not None and result.final.text == "Done anyway."
    assert result.history == result.messages  # nothing was replaced
    assert activities(history, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED) == ["compact_history"]
    # After a failure the turn doesn't try again: 2 tool rounds, 1 summary, 1 final call.
    assert len(fake.requests_for("anthropic")) == 4


async def test_cancel_during_compaction(fake: FakeModelApi, harness: HarnessFactory) -> None:
    fake.script(
        *two_tool_rounds(),
        Reply.delay(60, then=Reply.text("too late")),
        api="anthropic",
    )
    async with harness(TOOLS, **config(fake)) as h:
        turn = await h.start("Add things.")

        async def compacting() -> bool:
            pending = (await turn.handle.describe()).raw_description.pending_activities
            return any(a.activity_type.name == "compact_history" for a in pending)

        await eventually(compacting)
        await turn.cancel()
        with pytest.raises(TurnCancelledError) as cancelled:
            await turn.result()
    repaired = cancelled.value.result
    assert repaired is not None
    assert repaired.rollback == RollbackState.HISTORY_UNCHANGED
    assert repaired.history == repaired.messages  # no summary was applied
    last = repaired.history[-1]
    assert last.tool_results is not None and last.tool_results["c2"].text == "7"


async def test_a_session_carries_the_compacted_conversation_to_its_next_turn(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    summary = "The user wants 1+2 (got 3)."
    fake.script(
        *two_tool_rounds(),
        Reply.text(summary),  # the summary call
        Reply.text("Done: 3 and 7."),
        api="anthropic",
    )
    async with harness(TOOLS, **config(fake)) as h:
        session = await open_session(h.client, agent="test", task_queue=h.task_queue)
        first = await session.send("Add 1+2, then 3+4.")
        transcript = [m async for m in session.messages(until_turn=first.turn)]
        assert len(transcript) == 6  # the session's transcript keeps everything
        calls = len(fake.requests_for("anthropic"))
        fake.script(Reply.text("11."), api="anthropic")
        second = await session.send("And 5+6?")
        transcript += [m async for m in session.messages(len(transcript), until_turn=second.turn)]
        turn = await get_turn(h.client, second.turn_id).result()
        await session.close()
        closed = await session.result()
    # The second turn started from the compacted conversation, not the whole first turn.
    assert turn.history[0].text == SUMMARY_PREFIX + summary
    assert turn.history_change == HistoryChange.APPENDED
    [request] = fake.requests_for("anthropic")[calls:]
    assert "Add 1+2, then 3+4." not in json.dumps(request.body)
    assert json.dumps(summary)[1:-1] in json.dumps(request.body)
    assert closed.history == turn.history
    assert [m.text for m in closed.transcript] == [m.text for m in transcript]
    assert transcript[-1].text == "11." and len(transcript) == 8
