"""``turnkeep.testing``, the kit users test their agents with: per-agent scripts on the fake
model API, through the real SDKs; the pytest plugin's fixtures (used here as a user's test
uses them); ``TurnkeepEnvironment``; ``check_replay``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from anthropic import AsyncAnthropic
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from turnkeep import Agent, Settings, StopReason, TurnResult
from turnkeep.config.settings import AnthropicSettings
from turnkeep.contract.session_io import SESSION_WORKFLOW_NAME, SessionInput
from turnkeep.devserver.background import pid_alive
from turnkeep.testing import (
    FakeModel,
    FakeModelApi,
    ReplayFailedError,
    Reply,
    TurnkeepEnvironment,
    check_replay,
)
from turnkeep.testing.fake_model import FAKE_API_KEY
from turnkeep.testing.pytest_plugin import WorkerFactory

HISTORIES = Path(__file__).with_name("histories")


def error_text(result: TurnResult) -> str:
    """What a turn that ended with an error says about it."""
    assert result.stop_reason == StopReason.ERROR and result.final is not None
    return (result.final.channels or {})["error"][0].text  # type: ignore[union-attr]


def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"{topic}: they hold hands while they sleep."


async def test_agents_follow_scripts_of_their_own(
    turnkeep_worker: WorkerFactory, fake_model: FakeModel
) -> None:
    fake_model.script(
        "researcher",
        Reply.tool_calls(("call_1", "researcher__lookup", {"topic": "otters"})),
        Reply.text("Otters hold hands while they sleep."),
    )
    fake_model.script("critic", Reply.text("Too cute to check."))
    researcher = Agent(name="researcher", model=fake_model.model("researcher"), tools=[lookup])
    critic = Agent(name="critic", model=fake_model.model("critic"))
    async with turnkeep_worker(agents=[researcher, critic]) as worker:
        # The critic's turn runs first: each model's requests take only its own steps.
        critique = await worker.run("Check it.", agent="critic")
        found = await worker.run("Tell me about otters", agent="researcher")

    assert critique.final is not None and critique.final.text == "Too cute to check."
    assert found.final is not None and found.final.text == "Otters hold hands while they sleep."
    assert found.iterations == 1
    first, second = fake_model.requests("researcher")
    assert "researcher__lookup" in json.dumps(first.body["tools"])
    # The tool really ran, and its result went back to the model.
    assert "otters: they hold hands while they sleep." in json.dumps(second.body["messages"])
    assert len(fake_model.requests("critic")) == 1
    assert fake_model.pending("researcher") == fake_model.pending("critic") == 0
    # Through the real SDK, with the fake key, never a real one.
    assert first.headers["authorization"] == f"Bearer {FAKE_API_KEY}"


async def test_errors_are_retried_or_not_as_a_real_providers_are(
    turnkeep_worker: WorkerFactory, fake_model: FakeModel
) -> None:
    fake_model.script(
        "flaky",
        Reply.error(429, "slow down", headers={"retry-after-ms": "50"}),
        Reply.text("Made it."),
    )
    fake_model.script("broken", Reply.error(400, "no such thing"))
    agents = [
        Agent(name="flaky", model=fake_model.model("flaky")),
        Agent(name="broken", model=fake_model.model("broken")),
    ]
    async with turnkeep_worker(agents=agents) as worker:
        retried = await worker.run("go", agent="flaky")
        failed = await worker.run("go", agent="broken")

    assert retried.final is not None and retried.final.text == "Made it."
    assert len(fake_model.requests("flaky")) == 2
    assert failed.stop_reason == StopReason.ERROR
    assert "no such thing" in error_text(failed)
    assert len(fake_model.requests("broken")) == 1


async def test_a_delay_past_the_timeout_is_retried(
    turnkeep_worker: WorkerFactory, fake_model: FakeModel
) -> None:
    fake_model.script("slow", Reply.delay(30, then=Reply.text("Too late.")), Reply.text("On time."))
    slow = Agent(
        name="slow",
        model=fake_model.model("slow"),
        llm_timeouts={"start_to_close": 1, "heartbeat": None, "max_attempts": 2},
    )
    async with turnkeep_worker(agents=[slow]) as worker:
        result = await worker.run("go")
    assert result.final is not None and result.final.text == "On time."
    assert len(fake_model.requests("slow")) == 2


async def test_an_unscripted_model_fails_its_call_and_says_why(
    turnkeep_worker: WorkerFactory, fake_model: FakeModel
) -> None:
    fake_model.script("known", Reply.text("Hi."))
    async with turnkeep_worker(
        agents=[Agent(name="known", model=fake_model.model("known"))]
    ) as worker:
        await worker.run("go")
        again = await worker.run("go")
    assert again.stop_reason == StopReason.ERROR
    assert "the model 'known' script is exhausted" in error_text(again)


async def test_the_openai_api_serves_scripts_too(turnkeep_worker: WorkerFactory) -> None:
    with FakeModel(provider="openai") as fake:
        fake.script("helper", Reply.tool_calls(("c1", "helper__lookup", {"topic": "x"})))
        fake.script("helper", Reply.text("Done."))
        helper = Agent(name="helper", model=fake.model("helper"), tools=[lookup])
        async with turnkeep_worker(agents=[helper], fake=fake) as worker:
            result = await worker.run("go")
        assert [r.path for r in fake.requests("helper")] == ["/v1/chat/completions"] * 2
    assert result.final is not None and result.final.text == "Done."


async def test_model_scripts_come_before_the_apis_own(fake_model: FakeModel) -> None:
    """Server-free: the fake API's routing, through the SDK."""
    api = fake_model.api
    api.script(Reply.text("for anyone"), api="anthropic")
    fake_model.script("mine", Reply.text("for me"))
    client = AsyncAnthropic(api_key="k", base_url=api.base_url_anthropic, max_retries=0)
    try:
        texts = []
        for model in ("mine", "other"):
            message = await client.messages.create(
                model=model, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
            texts.append(message.content[0].text)  # type: ignore[union-attr]
    finally:
        await client.close()
    assert texts == ["for me", "for anyone"]
    assert [r.model for r in api.requests] == ["mine", "other"]


def test_configure_points_providers_at_the_fake_and_keeps_the_rest(
    monkeypatch: pytest.MonkeyPatch, fake_model: FakeModel
) -> None:
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    mine = Settings(anthropic=AnthropicSettings(api_key="sk-real", context_window=1000))
    configured = fake_model.configure(mine)
    assert configured.anthropic is not None and configured.openai is not None
    assert configured.anthropic.base_url == fake_model.api.base_url_anthropic
    assert configured.anthropic.api_key is not None
    assert configured.anthropic.api_key.get_secret_value() == FAKE_API_KEY
    assert configured.anthropic.context_window == 1000
    assert configured.openai.base_url == fake_model.api.base_url_openai
    # With a key configured the default model would become a provider's: it stays what it was.
    assert fake_model.configure(Settings()).default_model == "passthrough"
    assert mine.anthropic is not None and mine.anthropic.base_url is None  # not changed


def test_a_fake_models_name_is_one_model_id() -> None:
    fake = FakeModel(FakeModelApi())
    assert fake.model("a-b_1") == "anthropic.a-b_1"
    for name in ("a.low", "a/b", "a?reasoning=high", ""):
        with pytest.raises(ValueError, match="letters, digits"):
            fake.model(name)


async def test_a_session_on_the_harness_keeps_the_conversation(
    turnkeep_worker: WorkerFactory, fake_model: FakeModel
) -> None:
    fake_model.script("chatty", Reply.text("Hello, Ada."), Reply.text("You are Ada."))
    async with turnkeep_worker(
        agents=[Agent(name="chatty", model=fake_model.model("chatty"))]
    ) as worker:
        session = await worker.session()
        for text in ("I am Ada.", "Who am I?"):
            sent = await session.send(text)
        async for _ in session.messages(until_turn=sent.turn):
            pass
        await session.close()
        closed = await session.result()
    assert [m.text for m in closed.transcript] == [
        "I am Ada.",
        "Hello, Ada.",
        "Who am I?",
        "You are Ada.",
    ]
    # The second turn's model call was given the first exchange.
    assert "I am Ada." in json.dumps(fake_model.requests("chatty")[1].body["messages"])


async def test_a_worker_with_several_agents_needs_one_named(
    turnkeep_worker: WorkerFactory,
) -> None:
    agents = [Agent(name="a", model="passthrough"), Agent(name="b", model="passthrough")]
    async with turnkeep_worker(agents=agents) as worker:
        with pytest.raises(ValueError, match=r"name the agent: this worker has \['a', 'b'\]"):
            await worker.start("hi")
        result = await worker.run("hi", agent="b")
    assert result.final is not None and result.final.text == "hi"


@pytest.mark.server
async def test_an_environment_of_its_own() -> None:
    async with TurnkeepEnvironment() as env:
        env.fake.script("greeter", Reply.text("Hello!"))
        greeter = Agent(name="greeter", model=env.fake.model("greeter"))
        async with env.harness(agents=[greeter]) as worker:
            result = await worker.run("Hi")
        pid = env.server.pid
        assert pid_alive(pid)
    assert result.final is not None and result.final.text == "Hello!"
    assert not pid_alive(pid)
    with pytest.raises(RuntimeError, match="not running"):
        _ = env.client


# -- check_replay -------------------------------------------------------------------------


async def test_recorded_histories_replay_from_files_and_directories(tmp_path: Path) -> None:
    for name in ("plain", "parallel_tools"):
        shutil.copy(HISTORIES / f"{name}.json", tmp_path / f"{name}.json")
    # A session's commands name its own id: its file is named after it.
    shutil.copy(HISTORIES / "session.json", tmp_path / "replayed-session.json")
    assert await check_replay([tmp_path]) == 3
    assert await check_replay([tmp_path / "plain.json", str(tmp_path / "plain.json")]) == 2


async def test_a_history_the_code_no_longer_makes_fails_by_name(tmp_path: Path) -> None:
    recorded = json.loads((HISTORIES / "plain.json").read_text(encoding="utf-8"))
    for event in recorded["events"]:
        scheduled = event.get("activityTaskScheduledEventAttributes")
        if scheduled and scheduled["activityType"]["name"] == "prepare_turn":
            scheduled["activityType"]["name"] = "prepare_turn_v0"
    (tmp_path / "changed-turn.json").write_text(json.dumps(recorded), encoding="utf-8")
    shutil.copy(HISTORIES / "plain.json", tmp_path / "plain.json")
    with pytest.raises(ReplayFailedError) as failed:
        await check_replay([tmp_path])
    [name] = failed.value.failures
    assert name.startswith("changed-turn (run ")
    assert "prepare_turn" in str(failed.value)


async def test_no_histories_is_a_mistake_not_a_pass(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no histories"):
        await check_replay([tmp_path])
    assert not os.listdir(tmp_path)


async def test_a_run_with_no_workflow_task_yet_is_counted_not_waited_on(client: Client) -> None:
    """A run fetched before its first workflow task was scheduled holds only its start: a
    session's run fetched the moment it continued as new (``test_conversations`` fetches one
    now and then on a loaded machine), or, as here, one whose start is delayed. The replayer
    handed such a history waits for ever, past any cancellation; ``check_replay`` counts it."""
    handle = await client.start_workflow(
        SESSION_WORKFLOW_NAME,
        SessionInput(agent="test"),
        id=f"session-unstarted-{uuid.uuid4().hex[:8]}",
        task_queue=f"nowhere-{uuid.uuid4().hex[:8]}",
        start_delay=timedelta(hours=1),
    )
    history = await handle.fetch_history()
    assert [e.event_type for e in history.events] == [
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
    ]
    # In a thread of its own, as no cancellation would end a replay that waits.
    replayed: list[int] = []
    checking = threading.Thread(
        target=lambda: replayed.append(asyncio.run(check_replay([history]))), daemon=True
    )
    checking.start()
    await asyncio.to_thread(checking.join, 60)
    await handle.terminate()
    assert replayed == [1]
    # Beside histories with tasks, those are replayed as before.
    assert await check_replay([history, HISTORIES / "plain.json"]) == 2
