"""What an operator sees of a turn in the Temporal Web UI and filters turns by (the
documentation's *The Web UI*): activity summaries with the model's outcomes, current details as
the turn runs, search attributes, and a cluster without those attributes (the worker warns once,
`turnkeep setup` registers them). The text itself is unit-tested first, without a server."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory

from tests.conftest import (
    Harness,
    HarnessFactory,
    eventually,
    make_settings,
    turn_setup,
    turnkeep,
    write_script,
)
from tests.test_replay import replays_fresh_and_recorded
from turnkeep.client.connection import connect
from turnkeep.client.turns import TurnHandle
from turnkeep.config.paths import state_dir
from turnkeep.config.settings import Settings
from turnkeep.contract.activity_io import (
    HookPoint,
    PrepareTurnRequest,
    Timeouts,
    ToolCallRequest,
    TurnPlan,
    VisibilityPlan,
)
from turnkeep.contract.messages import CallToolResult, Message, StopReason, ToolCall
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.turn_io import (
    TurnCancelledError,
    TurnInput,
    TurnOverrides,
    TurnResult,
    Usage,
)
from turnkeep.devserver.embedded import (
    EmbeddedServer,
    ServerInfo,
    build_argv,
    ensure_background_server,
)
from turnkeep.observability.search_attributes import registration
from turnkeep.providers.prices import builtin_price
from turnkeep.testing import check_replay
from turnkeep.testing.fake_api import FakeModelApi, Reply, Tokens
from turnkeep.worker.build import build_worker
from turnkeep.workflows import visibility
from turnkeep.workflows.loop import TurnState

SEARCH_ATTRIBUTES_LOG = "turnkeep.observability.search_attributes"

# -- the text, without a server ----------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "short"),
    [
        ("anthropic.claude-sonnet-4-5", "sonnet"),
        ("anthropic.claude-3-5-haiku-20241022", "haiku"),
        ("claude-opus-4-1", "opus"),
        ("sonnet", "sonnet"),
        ("openai.gpt-4.1-mini", "openai.gpt-4.1-mini"),
        ("generic.llama3.2", "generic.llama3.2"),
        ("playback", "playback"),
    ],
)
def test_short_model_names_the_claude_family_else_keeps_the_string(model: str, short: str) -> None:
    assert visibility.short_model(model) == short


def request(call_index: int = 3, model: str = "anthropic.claude-sonnet-4-5") -> LlmRequest:
    return LlmRequest(
        agent="demo", model=model, call_index=call_index, instruction=None, messages=[], tools=[]
    )


def answer(stop: StopReason | None, calls: int = 0) -> Message:
    tool_calls = {f"call_{i}": ToolCall(name="weather__forecast") for i in range(calls)}
    return Message(role="assistant", stop_reason=stop, tool_calls=tool_calls or None)


def test_summaries() -> None:
    assert visibility.llm_summary(3, "anthropic.claude-sonnet-4-5") == "llm #3 · sonnet"
    outcome = visibility.outcome_summary
    assert outcome(request(), answer(StopReason.TOOL_USE, 2)) == "llm #3 · sonnet → toolUse(2)"
    assert outcome(request(), answer(StopReason.END_TURN)) == "llm #3 · sonnet → endTurn"
    assert outcome(request(), answer(StopReason.ERROR)) == "llm #3 · sonnet → error"
    # No stop reason is an end of turn to the loop, and so it reads.
    assert outcome(request(1, "playback"), answer(None)) == "llm #1 · playback → endTurn"
    call = ToolCallRequest(agent="demo", call_id="call_9f2", name="weather__forecast", arguments={})
    assert visibility.tool_summary(call) == "tool weather__forecast · call_9f2"
    hook = visibility.hook_summary(HookPoint.BEFORE_LLM_CALL, "audit")
    assert hook == "hook before_llm_call · audit"


def test_a_long_summary_is_clipped_below_the_servers_limit() -> None:
    call = ToolCallRequest(agent="demo", call_id="c1", name="srv__" + "ü" * 500, arguments={})
    summary = visibility.tool_summary(call)
    assert summary.startswith("tool srv__ü") and summary.endswith("…")
    # The server refuses summaries over 400 bytes of JSON (non-ASCII escaped).
    assert len(json.dumps(summary)) <= visibility.SUMMARY_MAX_JSON_BYTES


def plan(**fields: Any) -> TurnPlan:
    timeouts = Timeouts(start_to_close=10)
    base: dict[str, Any] = {
        "agent": "demo",
        "model": "anthropic.claude-sonnet-4-5",
        "max_iterations": 20,
        "use_history": True,
        "parallel_tool_calls": True,
        "has_tools": True,
        "llm": timeouts,
        "tools": timeouts,
    }
    return TurnPlan.model_validate({**base, **fields})


def state_after(*answers: Message) -> TurnState:
    state = TurnState.start(TurnInput(agent="demo", messages=["hi"]), plan())
    for i, reply in enumerate(answers):
        state.on_assistant(reply)
        state.usage["anthropic.claude-sonnet-4-5"] = Usage(
            input_tokens=1000 * (i + 1), output_tokens=10 * (i + 1)
        )
        if state.awaiting_tools:
            calls = state.messages[-1].tool_calls or {}
            state.on_tool_results({cid: _ok() for cid in calls}, {cid: 1.0 for cid in calls})
    return state


def _ok() -> CallToolResult:
    return CallToolResult.model_validate({"content": [{"type": "text", "text": "ok"}]})


def test_details_say_where_the_turn_is_and_what_it_has_used() -> None:
    state = state_after(answer(StopReason.TOOL_USE, 2))
    text = visibility.details(state, visibility.waiting_on_model(request(2)))
    assert text.startswith("**demo** · iteration 1 of 20 · waiting on model")
    assert "waiting on model `anthropic.claude-sonnet-4-5` (llm #2)" in text
    assert "model calls: 1 · tokens: 1,000 in, 10 out · last stop: `toolUse(2)`" in text

    calls = [
        ToolCallRequest(agent="demo", call_id=f"c{i}", name=name, arguments={})
        for i, name in enumerate(["weather__forecast", "files__read", "weather__forecast"])
    ]
    waiting = visibility.waiting_on_tools(calls)
    assert waiting == "waiting on tools `weather__forecast`, `files__read` (3 calls)"
    assert visibility.waiting_on_hook(HookPoint.AFTER_LLM_CALL, "audit") == (
        "waiting on hook `audit` (after_llm_call)"
    )
    assert visibility.compacting("sonnet") == "compacting history with model `sonnet`"

    state = state_after(answer(StopReason.TOOL_USE, 1), answer(StopReason.END_TURN))
    text = visibility.details(state, visibility.ended(state))
    assert "· finished" in text and "last stop: `endTurn`" in text
    assert "tokens: 2,000 in, 20 out" in text


@pytest.mark.parametrize(
    ("stop", "status"),
    [
        (StopReason.END_TURN, "Completed"),
        (StopReason.STOP_SEQUENCE, "Completed"),
        (StopReason.MAX_ITERATIONS, "Stopped"),
        (StopReason.MAX_TOKENS, "Stopped"),
        (StopReason.SAFETY, "Stopped"),
        (StopReason.ERROR, "Failed"),
        (StopReason.CANCELLED, "Cancelled"),
    ],
)
def test_status_says_how_a_turn_ended(stop: StopReason, status: str) -> None:
    state = state_after(answer(StopReason.TOOL_USE, 1))
    assert visibility.turn_status(state) == visibility.TurnStatus.RUNNING
    state.done, state.stop_reason = True, stop
    assert visibility.turn_status(state).value == status


def test_search_attribute_values_and_updates() -> None:
    running = state_after(answer(StopReason.TOOL_USE, 1))
    values = visibility.search_attribute_values(running)
    assert values == {
        "TurnkeepAgent": "demo",
        "TurnkeepModel": "anthropic.claude-sonnet-4-5",
        "TurnkeepStatus": "Running",
        "TurnkeepStopReason": None,  # how the turn ended: not yet
        "TurnkeepIterations": 1,
        "TurnkeepTokens": 1010,
        "TurnkeepCostUsd": None,  # the answers carry no cost: unknown
    }
    every = list(values)
    first = visibility.search_attribute_updates(values, {}, every)
    assert {u.key.name for u in first} == set(every) - {"TurnkeepStopReason", "TurnkeepCostUsd"}

    done = state_after(answer(StopReason.TOOL_USE, 1), answer(StopReason.END_TURN))
    later = visibility.search_attribute_values(done)
    changed = visibility.search_attribute_updates(later, values, every)
    assert {u.key.name: u.value for u in changed} == {
        "TurnkeepStatus": "Completed",
        "TurnkeepStopReason": "endTurn",
        "TurnkeepTokens": 2020,
    }
    # Only what the namespace has may be upserted.
    assert visibility.search_attribute_updates(later, {}, ["TurnkeepAgent"])[0].value == "demo"
    assert visibility.search_attribute_updates(later, {}, []) == []
    # A value that goes away is unset, not left stale.
    [unset] = visibility.search_attribute_updates(values, later, ["TurnkeepStopReason"])
    assert unset.key.name == "TurnkeepStopReason" and unset.value is None


def test_a_start_request_sets_what_a_new_turn_publishes_but_its_model() -> None:
    fresh = visibility.search_attribute_values(state_after())
    assert visibility.starting_values("demo") == {
        name: value
        for name, value in fresh.items()
        if name not in ("TurnkeepModel", "TurnkeepStopReason", "TurnkeepCostUsd")
    }
    # The workflow reads them back as what is already published: nothing left but the model.
    every = list(fresh)
    start = visibility.start_search_attributes("demo", every)
    published = visibility.published_values(start)
    [model] = visibility.search_attribute_updates(fresh, published, every)
    assert model.key.name == "TurnkeepModel"
    # Only attributes the namespace has go into a start request.
    only = visibility.start_search_attributes("demo", ["TurnkeepAgent", "TurnkeepModel"])
    assert visibility.published_values(only) == {"TurnkeepAgent": "demo"}


def test_search_attribute_definitions_for_the_dev_server() -> None:
    types = visibility.search_attribute_types()
    assert types == {
        "TurnkeepAgent": "Keyword",
        "TurnkeepModel": "Keyword",
        "TurnkeepStatus": "Keyword",
        "TurnkeepStopReason": "Keyword",
        "TurnkeepIterations": "Int",
        "TurnkeepTokens": "Int",
        "TurnkeepCostUsd": "Double",
        "TurnkeepReplayOf": "Keyword",
        "TurnkeepForkOf": "Keyword",
    }
    argv = build_argv(Path("temporal"), port=1, ui_port=None, search_attributes=types)
    assert "TurnkeepIterations=Int" in argv
    own = EmbeddedServer(ui=False, port=1).search_attributes
    assert own == types
    assert (
        EmbeddedServer(ui=False, port=1, turnkeep_search_attributes=False).search_attributes == {}
    )


def test_plans_take_the_configured_interval_and_publish_nothing_unchecked() -> None:
    """Until the worker has checked the namespace's search attributes, turns upsert none."""
    config = {"agents": {"a": {"model": "passthrough"}}}
    setup = turn_setup(Settings.model_validate(config))
    assert setup.visibility == VisibilityPlan(search_attribute_interval=60)
    config["visibility"] = {"search_attribute_interval": 0.5}
    setup = turn_setup(Settings.model_validate(config))
    assert setup.visibility == VisibilityPlan(search_attribute_interval=0.5)
    # Every plan carries it.
    request = PrepareTurnRequest(agent="a", overrides=TurnOverrides())
    assert setup.plan(request).visibility == setup.visibility
    with pytest.raises(ValidationError, match="search_attribute_interval"):
        Settings.model_validate({**config, "visibility": {"search_attribute_interval": -1}})


# -- a real turn on the dev server ---------------------------------------------------------


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


gate = asyncio.Event()


async def wait_for_gate() -> str:
    """Blocks until the test opens the gate."""
    await gate.wait()
    return "opened"


TOOLS: dict[str, list[Callable[..., Any]]] = {"local": [add, wait_for_gate]}


def calls(*specs: tuple[str, int, int]) -> dict[str, Any]:
    return {
        "tool_calls": {
            cid: {"name": "local__add", "arguments": {"a": a, "b": b}} for cid, a, b in specs
        }
    }


def one_round_agent(tmp_path: Path) -> dict[str, Any]:
    """A playback agent that calls ``local__add`` once, then answers."""
    script = write_script(tmp_path / "script.json", calls(("c1", 1, 2)), "Three.")
    return {"model": "playback", "playback": str(script), "servers": ["local"]}


async def history_summaries(client: Client, history: WorkflowHistory) -> list[str]:
    """Every summary in the history, in order: activities' (scheduled) and outcomes' (timers),
    decoded as the Web UI decodes them."""
    summaries: list[str] = []
    for event in history.events:
        if event.user_metadata.HasField("summary") and event.event_type in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            EventType.EVENT_TYPE_TIMER_STARTED,
        ):
            [text] = await client.data_converter.decode([event.user_metadata.summary], [str])
            summaries.append(text)
    return summaries


async def current_details(handle: TurnHandle) -> str:
    """The workflow's current details, read the way the Web UI reads them."""
    metadata = await handle.handle.query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return metadata.current_details


async def search_attributes(handle: TurnHandle) -> dict[str, Any]:
    """The turn's search attributes as the server holds them now (describe: no lag)."""
    description = await handle.handle.describe()
    return {
        pair.key.name: pair.value
        for pair in description.typed_search_attributes
        if pair.key.name.startswith("Turnkeep")
    }


def unique_agent() -> str:
    return f"vis{uuid.uuid4().hex[:8]}"


async def test_history_shows_each_outcome_its_tool_rows_do_not(
    harness: HarnessFactory, tmp_path: Path, client: Client
) -> None:
    """An outcome gets a row of its own unless the rows after it tell it: a toolUse answer
    whose every call runs is followed by one `tool …` row per call, so only an answer with a
    call answered in the workflow (here an unknown tool) and the final answer get one."""
    unknown = {"name": "local__nope", "arguments": {}}
    mixed = calls(("c3", 5, 6))
    mixed["tool_calls"]["c4"] = unknown
    script = write_script(
        tmp_path / "script.json", calls(("c1", 1, 2), ("c2", 3, 4)), mixed, "Done."
    )
    agent = {"model": "playback", "playback": str(script), "servers": ["local"]}
    hooks = {"audit": lambda context: None}
    with_hook = {**agent, "hooks": {"before_llm_call": ["audit"]}}
    async with harness(TOOLS, hooks, agents={"test": with_hook}) as h:
        handle = await h.start("go")
        result = await handle.result()
        history = await handle.handle.fetch_history()
        details = await current_details(handle)
    assert result.stop_reason == StopReason.END_TURN and result.iterations == 2

    audit = "hook before_llm_call · audit"
    assert await history_summaries(client, history) == [
        "prepare agent test",
        "list tools",
        audit,
        "llm #1 · playback",
        "tool local__add · c1",
        "tool local__add · c2",
        audit,
        "llm #2 · playback",
        "llm #2 · playback → toolUse(2)",
        "tool local__add · c3",
        audit,
        "llm #3 · playback",
        "llm #3 · playback → endTurn",
    ]
    # Each outcome is a timer started by the workflow task that goes on anyway (no extra
    # task, no local activity), cancelled by the one after its tools; none ever fires.
    events = history.events
    kinds = [e.event_type for e in events]
    assert EventType.EVENT_TYPE_MARKER_RECORDED not in kinds
    assert EventType.EVENT_TYPE_TIMER_FIRED not in kinds
    timers = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert len(timers) == 2
    # A timer goes out with its tools, or with the turn's completion (event ids count from 1).
    follows = [events[t.event_id].event_type for t in timers]
    assert follows == [
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    ]
    [cancel] = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED]
    started = timers[0].timer_started_event_attributes.timer_id
    assert cancel.timer_canceled_event_attributes.timer_id == started
    # ... in the task that schedules the next step once the tools are done (ids count from 1).
    before = events[cancel.event_id - 2]
    assert before.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    assert before.activity_task_scheduled_event_attributes.activity_type.name == "run_hook"
    # Only the start and activity results wake the workflow: no task for the outcomes.
    causes = {
        events[e.event_id - 2].event_type
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    }
    assert causes == {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
    }

    assert details.startswith("**test** · iteration 2 of ")
    assert "· finished" in details and "model calls: 3" in details
    assert "last stop: `endTurn`" in details


async def test_an_outcome_whose_tools_need_no_activity_is_still_recorded(
    harness: HarnessFactory, tmp_path: Path, client: Client
) -> None:
    """A call to a tool that does not exist is answered in the workflow task that started the
    outcome's timer: cancelled there, the timer would never reach the history. It is
    cancelled by the next outcome instead."""
    unknown = {"tool_calls": {"c1": {"name": "local__nope", "arguments": {}}}}
    script = write_script(tmp_path / "script.json", unknown, "Sorry.")
    agent = {"model": "playback", "playback": str(script), "servers": ["local"]}
    async with harness(TOOLS, agents={"test": agent}) as h:
        handle = await h.start("go")
        result = await handle.result()
        history = await handle.handle.fetch_history()
    assert result.stop_reason == StopReason.END_TURN
    summaries = await history_summaries(client, history)
    assert summaries[-3:] == [
        "llm #1 · playback → toolUse(1)",
        "llm #2 · playback",
        "llm #2 · playback → endTurn",
    ]
    events = history.events
    [first, _] = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    [cancel] = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED]
    assert cancel.timer_canceled_event_attributes.timer_id == (
        first.timer_started_event_attributes.timer_id
    )
    assert not any(e.event_type == EventType.EVENT_TYPE_TIMER_FIRED for e in events)
    await check_replay([history])


async def test_a_failed_model_call_reads_error(
    fake: FakeModelApi, harness: HarnessFactory, client: Client
) -> None:
    fake.script(Reply.error(400, "bad request"), api="anthropic")
    config = {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "agents": {"test": {"model": "anthropic.claude-sonnet-4-5"}},
    }
    async with harness(None, **config) as h:
        handle = await h.start("go")
        result = await handle.result()
        history = await handle.handle.fetch_history()
        attributes = await search_attributes(handle)
    assert result.stop_reason == StopReason.ERROR
    summaries = await history_summaries(client, history)
    assert summaries[-2:] == ["llm #1 · sonnet", "llm #1 · sonnet → error"]
    assert attributes["TurnkeepStatus"] == "Failed"
    assert attributes["TurnkeepStopReason"] == "error"


@pytest.mark.parametrize("interval", [0, 3600])
async def test_current_details_follow_the_turn(
    fake: FakeModelApi, harness: HarnessFactory, interval: float
) -> None:
    """Waiting on a tool, then on a slow model (the fake API holds its answer), then cancelled:
    the details say so at each step, and so do the search attributes, mid-turn after every
    answer with ``search_attribute_interval: 0`` and only at the start (by ``start_turn``, which
    cannot know the model) and the end with an interval longer than the turn (an hour here,
    so a slow machine cannot reach it; the default is checked by the unit test above)."""
    gate.clear()
    fake.script(
        Reply.tool_calls(("c1", "local__wait_for_gate", {}), usage=Tokens(input=100, output=7)),
        Reply.delay(120, then=Reply.text("too late")),
        api="anthropic",
    )
    model = "anthropic.claude-sonnet-4-5"
    agent = {"model": model, "servers": ["local"], "max_iterations": 5}
    config: dict[str, Any] = {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "agents": {"test": agent},
        "visibility": {"search_attribute_interval": interval},
    }
    async with harness(TOOLS, **config) as h:
        handle = await h.start("go")

        async def details_say(*parts: str) -> str | None:
            text = await current_details(handle)
            return text if all(part in text for part in parts) else None

        text = await eventually(
            lambda: details_say("waiting on tools `local__wait_for_gate` (1 call)"),
            "the details show the tool being waited on",
        )
        assert text.startswith("**test** · iteration 0 of 5")
        # Sonnet 4.5 at its list price.
        price = builtin_price("anthropic", "claude-sonnet-4-5")
        assert price is not None
        cost = round(price.cost(Usage(input_tokens=100, output_tokens=7)), 6)
        assert cost > 0
        totals = f"tokens: 100 in, 7 out · cost: {visibility.format_usd(cost)} · last stop"
        assert f"{totals}: `toolUse(1)`" in text
        running = await search_attributes(handle)
        expected = {
            "TurnkeepAgent": "test",
            "TurnkeepStatus": "Running",
            "TurnkeepIterations": 0,
            "TurnkeepTokens": 0,
        }
        if interval == 0:  # published after the answer, the model with it
            expected |= {"TurnkeepModel": model, "TurnkeepTokens": 107, "TurnkeepCostUsd": cost}
        assert running == expected

        gate.set()
        text = await eventually(
            lambda: details_say(f"waiting on model `{model}` (llm #2)"),
            "the details show the slow model call being waited on",
        )
        assert text.startswith("**test** · iteration 1 of 5")

        await handle.cancel()
        with pytest.raises(TurnCancelledError):
            await handle.result()
        text = await current_details(handle)
        ended = await search_attributes(handle)
    assert "· cancelled" in text and "last stop: `cancelled`" in text
    assert ended["TurnkeepStatus"] == "Cancelled" and ended["TurnkeepModel"] == model
    assert ended["TurnkeepStopReason"] == "cancelled"
    assert ended["TurnkeepIterations"] == 1
    assert ended["TurnkeepTokens"] == 107


def upserts(history: WorkflowHistory) -> list[int]:
    """Event ids of the history's search-attribute upserts."""
    kind = EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    return [e.event_id for e in history.events if e.event_type == kind]


async def test_start_turn_sets_what_it_knows_so_a_quick_turn_upserts_once(
    client: Client, harness: HarnessFactory, tmp_path: Path
) -> None:
    """``start_turn`` sets the agent, status, iterations and tokens with the start request; the
    workflow adds the rest at the end (a turn shorter than the interval), in one upsert. A turn
    started by any other client, without them, is published at its start as before. Both
    replay."""
    agent = one_round_agent(tmp_path)
    async with harness(TOOLS, agents={"test": agent}) as h:
        handle = await h.start("go")
        result = await handle.result()
        ours = await handle.handle.fetch_history()
        ended = await search_attributes(handle)
        plain = await client.start_workflow(
            "TurnWorkflow",
            TurnInput(agent="test", messages=["go"]),
            id=f"plain-{uuid.uuid4().hex[:8]}",
            task_queue=h.task_queue,
            result_type=TurnResult,
        )
        plain_result = await plain.result()
        theirs = await plain.fetch_history()
        plain_ended = await search_attributes(TurnHandle(plain, client))

    started = ours.events[0].workflow_execution_started_event_attributes.search_attributes
    assert set(started.indexed_fields) == {
        "TurnkeepAgent",
        "TurnkeepStatus",
        "TurnkeepIterations",
        "TurnkeepTokens",
    }
    # One upsert, in the turn's last workflow task (the completion is the event after it).
    assert upserts(ours) == [len(ours.events) - 2]
    tokens = ended.pop("TurnkeepTokens")
    assert tokens > 0 and tokens == total_tokens(result)
    assert ended == {
        "TurnkeepAgent": "test",
        "TurnkeepModel": "playback",
        "TurnkeepStatus": "Completed",
        "TurnkeepStopReason": "endTurn",
        "TurnkeepIterations": 1,
        "TurnkeepCostUsd": 0.0,  # the offline model costs nothing
    }
    # Without them at start: the start is published by the workflow's first task.
    assert not theirs.events[0].workflow_execution_started_event_attributes.HasField(
        "search_attributes"
    )
    # Each its own count: the playback model's estimate counts the tool's timing, which
    # differs from one run to the next.
    assert plain_ended.pop("TurnkeepTokens") == total_tokens(plain_result)
    assert len(upserts(theirs)) == 2 and plain_ended == ended
    for history in (ours, theirs):
        await check_replay([history])


def total_tokens(result: TurnResult) -> int:
    return sum(u.input_tokens + u.output_tokens for u in result.usage.values())


async def test_a_turn_that_fails_before_its_plan_does_not_stay_running(
    harness: HarnessFactory,
) -> None:
    async with harness(None) as h:
        handle = await h.start("go", agent="nobody")
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        attributes = await search_attributes(handle)
        history = await handle.handle.fetch_history()
    assert attributes["TurnkeepAgent"] == "nobody"
    assert attributes["TurnkeepStatus"] == "Failed"
    await check_replay([history])


async def test_turns_are_found_by_search_attributes(
    client: Client, harness: HarnessFactory, tmp_path: Path
) -> None:
    two_rounds = write_script(tmp_path / "a.json", calls(("c1", 1, 1)), calls(("c2", 2, 2)), "ok")
    plain = write_script(tmp_path / "b.json", "Just text.")
    looping = write_script(tmp_path / "c.json", *[calls((f"c{i}", i, i)) for i in range(4)])
    tooly, chatty = unique_agent(), unique_agent()

    def agent(script: Path) -> dict[str, Any]:
        return {"model": "playback", "playback": str(script), "servers": ["local"]}

    agents = {tooly: agent(two_rounds), chatty: agent(plain), f"{tooly}x": agent(looping)}
    async with harness(TOOLS, agents=agents) as h:
        ids = {}
        for name, turn in ((tooly, {}), (chatty, {}), (f"{tooly}x", {"max_iterations": 1})):
            handle = await h.start("go", agent=name, **turn)
            await handle.result()
            ids[name] = handle.workflow_id

    async def found(query: str) -> set[str]:
        return {w.id async for w in client.list_workflows(query=query)}

    async def finds(query: str, expected: set[str]) -> bool:
        return await found(query) == expected

    queries = {
        f"TurnkeepAgent='{tooly}' AND TurnkeepStopReason='endTurn'": {ids[tooly]},
        f"TurnkeepAgent IN ('{tooly}', '{chatty}') AND TurnkeepIterations >= 2": {ids[tooly]},
        f"TurnkeepAgent='{chatty}' AND TurnkeepIterations = 0": {ids[chatty]},
        f"TurnkeepAgent='{tooly}x' AND TurnkeepStatus='Stopped'": {ids[f"{tooly}x"]},
        f"TurnkeepStopReason='maxIterations' AND TurnkeepAgent='{tooly}x'": {ids[f"{tooly}x"]},
        f"TurnkeepModel='playback' AND TurnkeepAgent='{chatty}'": {ids[chatty]},
        f"TurnkeepAgent='{tooly}' AND TurnkeepStatus='Running'": set(),
    }
    for query, expected in queries.items():
        # Visibility is eventually consistent.
        await eventually(partial(finds, query, expected), f"{query!r} finds {expected}")


# -- a namespace without the search attributes --------------------------------------------


@pytest.fixture
async def bare_server() -> AsyncIterator[ServerInfo]:
    """A second dev server, started without turnkeep's search attributes, as an existing
    cluster is before `turnkeep setup`."""
    async with EmbeddedServer(ui=False, turnkeep_search_attributes=False) as info:
        yield info


@pytest.mark.server
async def test_without_the_attributes_turns_run_and_setup_registers_them(
    bare_server: ServerInfo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = await connect(bare_server.address, bare_server.namespace)
    agent = one_round_agent(tmp_path)
    settings = make_settings(tmp_path, agents={"test": agent})

    def worker(queue: str) -> Any:
        return build_worker(client, settings, function_tools=TOOLS, task_queue=queue)

    caplog.set_level(logging.WARNING, logger=SEARCH_ATTRIBUTES_LOG)
    async with worker("bare-1"):
        h = Harness(client, settings, "bare-1")
        handles = [await h.start("go"), await h.start("again")]
        for handle in handles:
            result = await handle.result()
            assert result.stop_reason == StopReason.END_TURN and result.iterations == 1
            assert await search_attributes(handle) == {}
    warnings = [r.getMessage() for r in caplog.records if r.name == SEARCH_ATTRIBUTES_LOG]
    assert len(warnings) == 1, warnings
    [warning] = warnings
    assert "TurnkeepAgent" in warning and "TurnkeepTokens" in warning
    assert "`turnkeep setup`" in warning

    setup = turnkeep("setup", temporal=bare_server, cwd=tmp_path)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "added: TurnkeepAgent (Keyword)" in setup.stdout
    assert "added: TurnkeepIterations (Int)" in setup.stdout
    again = turnkeep("setup", temporal=bare_server, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "added" not in again.stdout
    assert "already registered: TurnkeepAgent (Keyword)" in again.stdout

    caplog.clear()
    async with worker("bare-2"):
        handle = await Harness(client, settings, "bare-2").start("go")
        await handle.result()
    assert not [r for r in caplog.records if r.name == SEARCH_ATTRIBUTES_LOG]
    assert (await search_attributes(handle))["TurnkeepStopReason"] == "endTurn"

    query = "TurnkeepAgent='test' AND TurnkeepStopReason='endTurn'"

    async def listed() -> set[str]:
        return {w.id async for w in client.list_workflows(query=query)}

    # Only the turn that ran after setup has them: earlier turns never set them.
    assert await eventually(listed, "the turn is listed by its search attributes") == {
        handle.workflow_id
    }


@pytest.mark.server
async def test_an_attribute_of_another_type_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A namespace where TurnkeepIterations exists as a Keyword: `turnkeep setup` adds the
    others and reports the clash; the worker says why it leaves that one out, and turns set
    the others."""
    clash = {"TurnkeepIterations": "Keyword"}
    server = EmbeddedServer(ui=False, turnkeep_search_attributes=False, search_attributes=clash)
    async with server as info:
        setup = turnkeep("setup", temporal=info, cwd=tmp_path)
        client = await connect(info.address, info.namespace)
        agent = one_round_agent(tmp_path)
        settings = make_settings(tmp_path, agents={"test": agent})
        caplog.set_level(logging.WARNING, logger=SEARCH_ATTRIBUTES_LOG)
        async with build_worker(client, settings, function_tools=TOOLS, task_queue="clash"):
            handle = await Harness(client, settings, "clash").start("go")
            assert (await handle.result()).iterations == 1
        attributes = await search_attributes(handle)
    assert setup.returncode == 1
    assert "added: TurnkeepAgent (Keyword)" in setup.stdout
    assert "conflict: TurnkeepIterations is registered as Keyword but turnkeep needs Int" in (
        " ".join(setup.stdout.split())
    )
    [warning] = [r.getMessage() for r in caplog.records if r.name == SEARCH_ATTRIBUTES_LOG]
    assert "search attributes TurnkeepIterations (registered as Keyword, needs Int):" in warning
    assert "TurnkeepIterations" not in attributes
    assert attributes["TurnkeepStatus"] == "Completed"
    assert attributes["TurnkeepTokens"] > 0


@pytest.mark.server
async def test_a_reused_background_server_gets_the_attributes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`turnkeep run` reuses the background server an older turnkeep may have started without
    the attributes: they are registered on reuse, so its turns can be filtered too."""
    monkeypatch.setenv("TURNKEEP_STATE_DIR", str(tmp_path / "state"))
    async with EmbeddedServer(ui=False, turnkeep_search_attributes=False) as older:
        client = await connect(older.address, older.namespace)
        assert (await registration(client)).present == []
        record = {"pid": older.pid, "address": older.address, "ui_url": None}
        (state_dir() / "server.json").write_text(json.dumps(record))
        reused = await ensure_background_server()
        assert reused.pid == older.pid
        found = await registration(client)
    assert sorted(found.present) == sorted(visibility.search_attribute_types())


# -- replay ---------------------------------------------------------------------------------


async def test_a_turn_with_visibility_replays_fresh_and_recorded(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    """Upserts and outcome timers replay deterministically, from this code and from the
    recorded history (``visibility_timers`` among the replay tests' histories; refresh it as
    ``tests.test_replay`` says)."""
    # One call runs, one names no tool: the answer's outcome gets a timer, cancelled later.
    mixed = calls(("c1", 1, 2))
    mixed["tool_calls"]["c2"] = {"name": "local__nope", "arguments": {}}
    script = write_script(tmp_path / "script.json", mixed, "Three.")
    agent = {"model": "playback", "playback": str(script), "servers": ["local"]}
    async with harness(TOOLS, agents={"test": agent}) as h:
        handle = await h.start("go")
        await handle.result()
        fresh = await handle.handle.fetch_history()
    kinds = [e.event_type for e in fresh.events]
    assert EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES in kinds
    assert EventType.EVENT_TYPE_TIMER_STARTED in kinds
    assert EventType.EVENT_TYPE_TIMER_CANCELED in kinds
    await replays_fresh_and_recorded("visibility_timers", fresh)
