"""Counterfactual replay (issue #47): a finished turn's loop run again on another model or
prompt, each tool call answered from what the source turn recorded, so no tool runs again.
On a real dev server, the fake model API and function tools that count their runs."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError

from tests.conftest import Harness, HarnessFactory, eventually, make_settings
from tests.test_codec import (
    ARGUMENT,
    RESULT,
    assert_no_plaintext,
    encryption,
    new_key,
    worker_for,
)
from tests.worker_process import WorkerProcesses, effects_server, write_config
from turnkeep.client.replays import ReplayError, replay_turn
from turnkeep.client.turns import get_turn, start_turn
from turnkeep.contract.activity_io import ToolCallRequest
from turnkeep.contract.messages import CallToolResult, TextContent
from turnkeep.contract.replay_io import RecordedCall
from turnkeep.contract.turn_io import WORKFLOW_NAME, ReplayOf, TurnInput, TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.workflows.replays import RecordedResults

MODEL = "openai.test-model"
OTHER = "openai.other-model"
runs: list[str] = []


def lookup(city: str) -> str:
    """The weather in a city."""
    runs.append(city)
    return f"sunny in {city} (run {len(runs)})"


TOOLS = {"local": [lookup]}


def config(fake: FakeModelApi, **agent: Any) -> dict[str, Any]:
    return {
        "openai": {"api_key": "sk-test", "base_url": fake.base_url_openai},
        "agents": {"test": {"model": MODEL, "models": [OTHER], "servers": ["local"], **agent}},
    }


def call(call_id: str, city: str) -> Any:
    return Reply.tool_calls((call_id, "local__lookup", {"city": city}))


async def source_turn(h: Harness, fake: FakeModelApi) -> str:
    """A finished turn that looked up Paris, then answered."""
    fake.script(call("c1", "Paris"), Reply.text("Paris is sunny."), api="openai")
    turn = await h.start("weather in Paris?")
    await turn.result()
    return turn.workflow_id


def refusal(err: BaseException) -> ApplicationError:
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.__cause__
    assert isinstance(cause, ApplicationError)
    return cause


async def forged_replay(
    client: Client, task_queue: str, agent: str, source: str
) -> ApplicationError:
    """A replay started by hand, past ``replay_turn``'s checks: how the worker refuses it."""
    forged = await client.start_workflow(
        WORKFLOW_NAME,
        TurnInput(agent=agent, messages=["x"], replay_of=ReplayOf(turn=source)),
        id=f"forged-{uuid.uuid4().hex}",
        task_queue=task_queue,
        result_type=TurnResult,
    )
    with pytest.raises(WorkflowFailureError) as caught:
        await forged.result()
    return refusal(caught.value)


async def test_recorded_calls_get_recorded_results_and_nothing_runs(
    harness: HarnessFactory, fake: FakeModelApi, client: Client
) -> None:
    runs.clear()
    async with harness(TOOLS, **config(fake)) as h:
        source = await source_turn(h, fake)
        assert runs == ["Paris"]
        # The replay asks for Paris again (recorded), then Rome (not recorded).
        fake.script(
            call("r1", "Paris"), call("r2", "Rome"), Reply.text("Paris sunny, Rome ?"), api="openai"
        )
        replay = await replay_turn(h.client, source, model=OTHER, task_queue=h.task_queue)
        report = await replay.report()
    assert runs == ["Paris"], "no tool ran again"
    result = await replay.result()
    results = [r for m in result.messages for r in (m.tool_results or {}).values()]
    assert results[0].text == "sunny in Paris (run 1)" and not results[0].is_error
    assert results[1].is_error and "no call of tool 'local__lookup'" in results[1].text
    # The replay's input is the source's, read by the worker.
    assert result.messages[0].text == "weather in Paris?"

    assert report.source.final == "Paris is sunny."
    assert report.replay.final == "Paris sunny, Rome ?"
    assert report.replay.models == [OTHER] and report.source.models == [MODEL]
    assert [c.arguments for c in report.same_calls] == [{"city": "Paris"}]
    assert [c.arguments for c in report.new_calls] == [{"city": "Rome"}]
    assert report.missing_calls == [] and not report.same_final
    assert (report.source.iterations, report.replay.iterations) == (1, 2)
    assert report.replay.model_calls == 3 and report.replay.duration_ms is not None
    # Marked as a replay where the Web UI and visibility queries look.
    described = await client.get_workflow_handle(replay.workflow_id).describe()
    assert described.typed_search_attributes.get(
        SearchAttributeKey.for_keyword("TurnkeepReplayOf")
    ) == (source)
    assert (await described.static_summary()) == f"replay of {source} on {OTHER}"


async def test_live_tools_only_when_the_agent_allows_them(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    runs.clear()
    async with harness(TOOLS, **config(fake)) as h:
        source = await source_turn(h, fake)
        replay = await replay_turn(h.client, source, live_tools=True, task_queue=h.task_queue)
        with pytest.raises(WorkflowFailureError) as caught:
            await replay.result()
        err = refusal(caught.value)
        assert err.type == "ReplayRefused" and "replay_live_tools" in err.message
    runs.clear()
    async with harness(TOOLS, **config(fake, replay_live_tools=True)) as h:
        source = await source_turn(h, fake)
        fake.script(call("r1", "Paris"), call("r2", "Rome"), Reply.text("both"), api="openai")
        replay = await replay_turn(h.client, source, live_tools=True, task_queue=h.task_queue)
        report = await replay.report()
    # Paris from the record, Rome for real.
    assert runs == ["Paris", "Rome"]
    assert [c.result for c in report.replay.tool_calls] == [
        "sunny in Paris (run 1)",
        "sunny in Rome (run 2)",
    ]


async def test_an_instruction_only_where_the_agent_lists_it(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    async with harness(TOOLS, **config(fake, instruction="Be terse.")) as h:
        source = await source_turn(h, fake)
        replay = await replay_turn(
            h.client, source, instruction="Be poetic.", task_queue=h.task_queue
        )
        with pytest.raises(WorkflowFailureError) as caught:
            await replay.result()
        assert "instruction" in refusal(caught.value).message
    async with harness(TOOLS, **config(fake, overrides=["instruction"])) as h:
        source = await source_turn(h, fake)
        fake.reset()
        fake.script(Reply.text("O Paris"), api="openai")
        replay = await replay_turn(
            h.client, source, instruction="Be poetic.", task_queue=h.task_queue
        )
        await replay.result()
        [body] = [r.body for r in fake.requests_for("openai")]
    assert body["messages"][0] == {"role": "system", "content": "Be poetic."}


async def test_unknown_turn_running_turn_unknown_agent_and_model(
    harness: HarnessFactory, fake: FakeModelApi, client: Client
) -> None:
    with pytest.raises(ReplayError, match="no turn with workflow id"):
        await replay_turn(client, f"nope-{uuid.uuid4().hex}")
    # A turn on a queue no worker polls stays running.
    running = await client.start_workflow(
        WORKFLOW_NAME,
        TurnInput(agent="test", messages=["hi"]),
        id=f"running-{uuid.uuid4().hex}",
        task_queue=f"nobody-{uuid.uuid4().hex}",
    )
    try:
        with pytest.raises(ReplayError, match="still running"):
            await replay_turn(client, running.id)
        async with harness(TOOLS, **config(fake)) as h:
            source = await source_turn(h, fake)
            for options, kind in (
                ({"agent": "nobody"}, "UnknownAgent"),
                ({"model": "openai.not-allowed"}, "ModelNotAllowed"),
            ):
                replay = await replay_turn(client, source, task_queue=h.task_queue, **options)
                with pytest.raises(WorkflowFailureError) as caught:
                    await replay.result()
                assert refusal(caught.value).type == kind
            # A client that skips replay_turn's checks meets the worker's: it reads only a
            # finished turn of one of its agents.
            for source_id, says in ((running.id, "still running"), ("nope", "no turn")):
                err = await forged_replay(client, h.task_queue, "test", source_id)
                assert err.type == "ReplayRefused" and says in err.message
    finally:
        await running.terminate()


async def test_a_worker_replays_only_turns_of_its_own_agents(
    harness: HarnessFactory, fake: FakeModelApi, client: Client
) -> None:
    async with harness(TOOLS, **config(fake)) as h:
        source = await source_turn(h, fake)
    other = config(fake)
    other["agents"] = {"other": other["agents"]["test"]}
    async with harness(TOOLS, **other) as h:
        err = await forged_replay(client, h.task_queue, "other", source)
    assert err.type == "ReplayRefused" and "does not serve" in err.message


async def test_a_replay_of_an_encrypted_turn_stays_encrypted(
    temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    secret = "prompt-tapir-4d2e"
    settings = make_settings(
        tmp_path,
        encryption=encryption("k1", k1=new_key()),
        openai={"api_key": "sk-test", "base_url": fake.base_url_openai},
        agents={"test": {"model": MODEL, "servers": ["tools"]}},
    )
    echo = Reply.tool_calls(("c1", "tools__echo", {"text": ARGUMENT}))
    async with worker_for(temporal, settings) as h:
        fake.script(echo, Reply.text("ok"), api="openai")
        source = await h.start(secret)
        await source.result()
        fake.script(echo, Reply.text("ok"), api="openai")
        replay = await replay_turn(h.client, source.workflow_id, task_queue=h.task_queue)
        result = await replay.result()
        history = await h.client.get_workflow_handle(replay.workflow_id).fetch_history()
    assert result.messages[0].text == secret
    [recorded] = [r for m in result.messages for r in (m.tool_results or {}).values()]
    assert RESULT in recorded.text
    assert_no_plaintext(history, (secret, ARGUMENT, RESULT))


@pytest.mark.slow
async def test_a_replay_survives_a_killed_worker(
    client: Client, temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    """A replay is a durable turn: its worker killed during a model call, another takes it on
    from its history, and the source's tool still ran only once (for the source)."""
    record = tmp_path / "record.jsonl"
    task_queue = f"replay-{uuid.uuid4().hex[:10]}"
    agent = {
        "model": "anthropic.test-model",
        "servers": ["effects"],
        "llm_timeouts": {"start_to_close": 60, "heartbeat": 2, "max_attempts": 5},
    }
    config = write_config(
        tmp_path / "turnkeep.yaml",
        {
            "task_queue": task_queue,
            "mcp": {"servers": {"effects": effects_server(record)}},
            "agents": {"test": agent},
            "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        },
    )
    effect = Reply.tool_calls(("c1", "effects__effect", {"tag": "a"}))
    with WorkerProcesses(config, temporal.address, tmp_path / "logs") as workers:
        first = await workers.start_polling(client, task_queue)
        fake.script(effect, Reply.text("done"), api="anthropic")
        source = await start_turn(
            client, TurnInput(agent="test", messages=["go"]), task_queue=task_queue
        )
        await source.result()
        fake.reset()
        # The replay's second model call hangs until its worker dies; the retry is answered.
        again = Reply.text("again")
        fake.script(effect, Reply.delay(300, then=again), again, api="anthropic")
        replay = await replay_turn(client, source.workflow_id, task_queue=task_queue)
        await eventually(lambda: len(fake.requests) == 2, "the replay's second model call")
        workers.kill(first)
        await workers.start_polling(client, task_queue)
        result = await asyncio.wait_for(replay.result(), 120)
    assert result.final is not None and result.final.text == "again"
    [recorded] = [r for m in result.messages for r in (m.tool_results or {}).values()]
    assert not recorded.is_error
    applied = [line for line in record.read_text().splitlines() if '"applied"' in line]
    assert len(applied) == 1, "the tool ran for the source only"


async def test_a_sessions_turn_replays_with_the_conversation_before_it(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    """A session's turn holds its conversation by reference: the replay gets it expanded."""
    async with harness(TOOLS, **config(fake)) as h:
        session = await h.session()
        fake.script(Reply.text("Hello."), Reply.text("Paris is sunny."), api="openai")
        await session.send("hi")
        second = await session.send("weather in Paris?")
        async for _ in session.messages(until_turn=second.turn):
            pass
        await get_turn(h.client, second.turn_id).result()
        fake.reset()
        fake.script(Reply.text("Sunny, I think."), api="openai")
        replay = await replay_turn(h.client, second.turn_id, task_queue=h.task_queue)
        result = await replay.result()
        [body] = [r.body for r in fake.requests_for("openai")]
    said = [m["content"] for m in body["messages"] if isinstance(m.get("content"), str)]
    assert said[-3:] == ["hi", "Hello.", "weather in Paris?"]
    assert result.final is not None and result.final.text == "Sunny, I think."


def test_a_call_made_again_gets_the_recorded_results_in_order_then_the_last() -> None:
    calls = [
        RecordedCall(
            name="t",
            arguments={"a": 1, "b": 2},
            result=CallToolResult(content=[TextContent(text="one")]),
        ),
        RecordedCall(
            name="t",
            arguments={"b": 2, "a": 1},
            result=CallToolResult(content=[TextContent(text="two")]),
        ),
    ]
    recorded = RecordedResults("src", calls, live=False)
    asked = ToolCallRequest(agent="x", call_id="c", name="t", arguments={"a": 1, "b": 2})
    taken = [recorded.take(asked) for _ in range(3)]
    assert [r.text if r else None for r in taken] == ["one", "two", "two"]
    assert recorded.take(asked.model_copy(update={"arguments": {"a": 2}})) is None
