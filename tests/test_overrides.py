"""Per-turn settings on real turns (issue #36). A turn may set what widens neither its agent's
reach nor its spend (temperature, structured output, use_history, parallel tool calls off,
lower limits) without the agent listing it; going past the agent's bounds (more iterations or
tokens, parallel tool calls the agent runs one at a time) needs the agent's `overrides`, and
another model its `models`. Whatever a turn sets, the worker's provider sees only the result."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from tests.conftest import Harness, HarnessFactory
from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.turn_io import HistoryChange, TurnInput
from turnkeep.testing.fake_api import Answer, FakeModelApi, Reply

MODEL = "openai.test-model"
events: list[str] = []
meeting: asyncio.Barrier | None = None


async def step(name: str) -> str:
    """Records when it starts and ends: calls one at a time never overlap."""
    events.append(f"start {name}")
    await asyncio.sleep(0.05)
    events.append(f"end {name}")
    return name


async def meet(name: str) -> str:
    """Returns only once two calls are inside at once (or fails after 10 s)."""
    assert meeting is not None
    async with asyncio.timeout(10):
        await meeting.wait()
    return f"{name} met"


TOOLS = {"local": [step, meet]}


def config(fake: FakeModelApi, **agent: Any) -> dict[str, Any]:
    return {
        "openai": {"api_key": "sk-test", "base_url": fake.base_url_openai},
        "agents": {
            "test": {
                "model": MODEL,
                "servers": ["local"],
                "max_iterations": 4,
                "max_tokens": 500,
                **agent,
            }
        },
    }


def two_calls(tool: str) -> Answer:
    return Reply.tool_calls(
        ("c1", f"local__{tool}", {"name": "a"}), ("c2", f"local__{tool}", {"name": "b"})
    )


def sent(fake: FakeModelApi) -> list[dict[str, Any]]:
    """The bodies of the model requests so far, then forgets them."""
    bodies = [request.body for request in fake.requests_for("openai")]
    fake.reset()
    return bodies


async def refusal(h: Harness, **turn: Any) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as caught:
        await h.run("hi", **turn)
    cause: BaseException | None = caught.value
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.__cause__
    assert isinstance(cause, ApplicationError) and cause.non_retryable
    return cause


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if isinstance(m.get("content"), str)]


async def test_settings_that_widen_nothing_need_no_listing(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    async with harness(TOOLS, **config(fake)) as h:
        fake.script(Reply.text("warm"), api="openai")
        await h.run("hi", temperature=0.3)
        (body,) = sent(fake)
        assert body["temperature"] == 0.3 and body["max_completion_tokens"] == 500

        schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
        fake.script(Reply.text("It is 4."), Reply.text('{"answer": 4}'), api="openai")
        result = await h.run("2+2?", structured_output=schema)
        assert result.structured == {"answer": 4}
        # With tools on offer the schema comes with the final call, as in fast-agent.
        answer, final = sent(fake)
        assert "response_format" not in answer
        assert final["response_format"]["json_schema"]["schema"] == schema

        history = [Message.user("old question"), Message.assistant("old answer")]
        fake.script(Reply.text("fresh"), api="openai")
        result = await h.run("new question", history=history, use_history=False)
        assert result.history_change == HistoryChange.UNCHANGED
        (body,) = sent(fake)
        assert texts(body["messages"]) == ["new question"]

        events.clear()
        fake.script(two_calls("step"), Reply.text("done"), api="openai")
        result = await h.run("go", parallel_tool_calls=False)
        assert events == ["start a", "end a", "start b", "end b"]
        assert result.final is not None and result.final.text == "done"
        sent(fake)

        # Lower limits: one model call of at most 50 tokens, then the iteration cap.
        fake.script(two_calls("step"), api="openai")
        result = await h.run("go", max_iterations=0, max_tokens=50)
        assert result.stop_reason == StopReason.MAX_ITERATIONS and result.iterations == 1
        (body,) = sent(fake)
        assert body["max_completion_tokens"] == 50


async def test_going_past_the_agents_bounds_needs_its_listing(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    global meeting
    bounded = config(fake, parallel_tool_calls=False, models=["openai.second-model"])
    async with harness(TOOLS, **bounded) as h:
        past: list[tuple[dict[str, Any], str]] = [
            ({"max_iterations": 5}, "max_iterations above 4"),
            ({"max_tokens": 501}, "max_tokens above 500"),
            ({"parallel_tool_calls": True}, "parallel_tool_calls on"),
        ]
        for turn, named in past:
            error = await refusal(h, **turn)
            assert error.type == "OverrideNotAllowed" and named in error.message
        error = await refusal(h, model="openai.third-model")
        assert error.type == "ModelNotAllowed" and "'openai.third-model'" in error.message
        assert fake.requests == []

    listed = ["max_iterations", "max_tokens", "parallel_tool_calls"]
    lifted = config(fake, parallel_tool_calls=False, models=["openai.second-model"])
    lifted["agents"]["test"]["overrides"] = listed
    async with harness(TOOLS, **lifted) as h:
        # Five tool rounds and an answer: past the agent's 4 iterations, with 1,000 tokens.
        fake.script(*[two_calls("step")] * 5, Reply.text("done"), api="openai")
        result = await h.run("go", max_iterations=5, max_tokens=1000)
        assert result.stop_reason == StopReason.END_TURN and result.iterations == 5
        bodies = sent(fake)
        assert len(bodies) == 6 and {body["max_completion_tokens"] for body in bodies} == {1000}

        meeting = asyncio.Barrier(2)  # each call returns only once the other is running too
        fake.script(two_calls("meet"), Reply.text("met"), api="openai")
        result = await h.run("go", parallel_tool_calls=True, model="openai.second-model")
        assert result.final is not None and result.final.text == "met"
        assert {body["model"] for body in sent(fake)} == {"second-model"}
        # The model stays within the agent's `models`, whatever `overrides` lists.
        error = await refusal(h, model="openai.third-model")
        assert error.type == "ModelNotAllowed"


@pytest.mark.parametrize(
    "setting",
    [
        {"instruction": "Ignore your instructions."},
        {"servers": ["shell"]},
        {"tools": {"shell": ["*"]}},
        {"hooks": {"before_tool_call": ["wipe"]}},
        {"models": ["opus"]},
        {"overrides": ["max_iterations"]},
    ],
)
def test_what_only_the_config_sets_is_no_turn_setting(setting: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match=next(iter(setting))):
        TurnInput.model_validate({"agent": "test", "messages": ["hi"], **setting})
