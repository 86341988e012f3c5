"""fast-agent's model strings: providers, aliases, reasoning (`?reasoning=`, `.low`), what an
agent allows, unknown context windows, and reasoning as the OpenAI and Anthropic SDKs send it
to the fake API on loopback."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from tests.conftest import HarnessFactory, make_settings, turn_setup
from turnkeep.config.settings import AnthropicSettings, ProviderSettings
from turnkeep.contract.activity_io import PrepareTurnRequest, ToolSpec
from turnkeep.contract.messages import Message, TextContent
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.turn_io import TurnOverrides
from turnkeep.fastagent.model_strings import ModelRef, Reasoning
from turnkeep.providers.anthropic import THINKING_BLOCKS, AnthropicProvider
from turnkeep.providers.openai import OpenAIProvider
from turnkeep.providers.registry import (
    ModelCatalog,
    announce_unknown_context_windows,
    installed_providers,
)
from turnkeep.testing.fake_api import FakeModelApi, Reply

KEY = "sk-model-strings-SECRET-0a1b2c"


@pytest.mark.parametrize(
    ("model", "means"),
    [
        # provider.model, and fast-agent's provider/model
        ("openai.gpt-4.1", "openai.gpt-4.1"),
        ("groq/qwen/qwen3-32b", "groq.qwen/qwen3-32b"),
        ("generic.llama3.2:3b", "generic.llama3.2:3b"),
        ("openrouter.anthropic/claude-sonnet-4", "openrouter.anthropic/claude-sonnet-4"),
        # aliases and model names fast-agent gives a provider
        ("sonnet", "anthropic.claude-sonnet-5"),
        ("haiku", "anthropic.claude-haiku-4-5"),
        ("claude-opus-4-1", "anthropic.claude-opus-4-1"),
        ("gpt-5-mini", "openai.gpt-5-mini"),
        ("deepseek", "deepseek.deepseek-v4-flash"),
        ("deepseek-chat", "deepseek.deepseek-chat"),
        ("gemini25", "google.gemini-2.5-flash"),
        ("grok", "xai.grok-4.6"),
        ("qwen3-32b", "groq.qwen/qwen3-32b"),
        ("openai/gpt-oss-120b", "groq.openai/gpt-oss-120b"),  # a Groq model id
        ("azure", "azure"),  # the configured deployment
        ("azure.my-deployment", "azure.my-deployment"),
        ("passthrough", "passthrough"),
        # fast-agent prefixes for providers turnkeep has under another name
        ("responses.gpt-5.1", "openai.gpt-5.1"),
        ("googleoai.gemini-2.0-flash", "google.gemini-2.0-flash"),
        # reasoning: the query, the older suffix, and aliases' own defaults
        ("gpt-5-mini?reasoning=low", "openai.gpt-5-mini?reasoning=low"),
        ("gpt-5-mini.low", "openai.gpt-5-mini?reasoning=low"),
        ("openai.o3.high", "openai.o3?reasoning=high"),
        ("gpt-4.1.minimal", "openai.gpt-4.1?reasoning=minimal"),
        ("gpt-5.5", "openai.gpt-5.5?reasoning=medium"),
        ("gpt-5.5?reasoning=high", "openai.gpt-5.5?reasoning=high"),
        ("sonnet?reasoning=adaptive", "anthropic.claude-sonnet-5?reasoning=auto"),
        ("claude-opus-4-1?reasoning=4096", "anthropic.claude-opus-4-1?reasoning=4096"),
        ("claude-opus-4-1?reasoning=on", "anthropic.claude-opus-4-1?reasoning=on"),
        ("deepseek.deepseek-chat?reasoning=off", "deepseek.deepseek-chat?reasoning=off"),
    ],
)
def test_model_strings_mean_what_they_mean_to_fast_agent(model: str, means: str) -> None:
    assert str(installed_providers().resolve(model)) == means


@pytest.mark.parametrize(
    ("model", "kind", "words"),
    [
        ("gpt-5-mini?reasoning=extreme", "InvalidModel", "Invalid reasoning value 'extreme'"),
        ("gpt-5-mini?temperature=0.2", "InvalidModel", "only `?reasoning=`"),
        ("gpt-5-mini.low?reasoning=high", "InvalidModel", "reasoning twice"),
        ("passthrough?reasoning=high", "InvalidModel", "passthrough provider takes no setting"),
        ("gpt-5-mini?reasoning=2048", "InvalidModel", "not budget 2048"),
        ("mystery-model", "UnknownModel", "Unknown model 'mystery-model'"),
        ("nothing.low", "UnknownModel", "Unknown model"),
    ],
)
def test_bad_model_strings_say_what_is_wrong(model: str, kind: str, words: str) -> None:
    with pytest.raises(ApplicationError) as caught:
        installed_providers().resolve(model)
    assert caught.value.type == kind and caught.value.non_retryable
    assert words in caught.value.message


def plan(tmp_path: Path, agent: dict[str, Any], model: str | None = None, **config: Any) -> Any:
    settings = make_settings(tmp_path, agents={"a": agent}, **config)
    request = PrepareTurnRequest(agent="a", overrides=TurnOverrides(model=model))
    return turn_setup(settings).plan(request)


def test_an_agent_allows_models_by_what_they_name_reasoning_included(tmp_path: Path) -> None:
    agent = {"model": "passthrough", "models": ["gpt-5-mini?reasoning=low", "sonnet"]}
    # Other spellings of a listed model are that model.
    for spelled in ("gpt-5-mini.low", "openai.gpt-5-mini?reasoning=low", "openai/gpt-5-mini.low"):
        assert plan(tmp_path, agent, spelled).model == spelled
    assert plan(tmp_path, agent, "anthropic.claude-sonnet-5").model == "anthropic.claude-sonnet-5"
    # A turn can't raise the effort, drop it, or pick the alias's other model.
    for refused in ("gpt-5-mini?reasoning=high", "gpt-5-mini", "sonnet?reasoning=high", "opus"):
        with pytest.raises(ApplicationError) as caught:
            plan(tmp_path, agent, refused)
        assert caught.value.type == "ModelNotAllowed" and repr(refused) in caught.value.message


def test_unknown_context_windows_mean_no_compaction_until_configured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    generic = {"generic": {"base_url": "http://127.0.0.1:9/v1"}}
    # No window known: no compaction, instead of compacting at a guessed 32k.
    assert plan(tmp_path, {"model": "generic.llama3.2"}, **generic).compaction is None
    # Known models keep theirs (fast-agent's model database).
    known = plan(tmp_path, {"model": "gpt-4o", "compaction": {"threshold": 0.5}})
    assert known.compaction.threshold_tokens == 64_000
    # The provider block's window, or the agent's own.
    block = {"generic": {**generic["generic"], "context_window": 100_000}}
    agent = {"model": "generic.llama3.2", "compaction": {"threshold": 0.5}}
    assert plan(tmp_path, agent, **block).compaction.threshold_tokens == 50_000
    agent["compaction"] = {"threshold": 0.5, "context_window": 8_000}
    assert plan(tmp_path, agent, **generic).compaction.threshold_tokens == 4_000

    # The worker names each such model once when it starts.
    settings = make_settings(
        tmp_path,
        **generic,
        openrouter={"api_key": KEY},
        agents={
            "a": {"model": "generic.llama3.2", "models": ["openrouter.x/y", "gpt-4o"]},
            "b": {"model": "generic.llama3.2"},
            "c": {"model": "generic.qwen", "compaction": {"context_window": 32_000}},
            "d": {"model": "generic.mistral", "compaction": {"enabled": False}},
        },
    )
    unknown = ModelCatalog(settings).unknown_context_windows(settings.agents.values())
    assert unknown == {"generic.llama3.2": "generic", "openrouter.x/y": "openrouter"}
    with caplog.at_level(logging.WARNING):
        announce_unknown_context_windows(unknown)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "'generic.llama3.2'" in lines[0] and "`generic.context_window`" in lines[0]
    assert "`openrouter.context_window`" in lines[1]
    assert KEY not in caplog.text


async def test_a_starting_worker_names_each_model_without_a_window_once(
    harness: HarnessFactory, caplog: pytest.LogCaptureFixture
) -> None:
    agents = {
        "test": {"model": "passthrough", "models": ["generic.llama3.2"]},
        "other": {"model": "generic.llama3.2"},
    }
    with caplog.at_level(logging.WARNING):
        async with harness(generic={"base_url": "http://127.0.0.1:9/v1"}, agents=agents) as h:
            result = await h.run("hello")
    assert result.final is not None and result.final.text == "hello"
    lines = [r.getMessage() for r in caplog.records if "context window unknown" in r.getMessage()]
    assert len(lines) == 1 and "'generic.llama3.2'" in lines[0]


def test_fast_agents_anthropic_thinking_keys_are_honoured(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        anthropic={"thinking_enabled": True, "thinking_budget_tokens": 2048},
        azure={"resource_name": "r", "azure_deployment": "d", "api_version": "2024-10-21"},
    )
    assert isinstance(settings.anthropic, AnthropicSettings)
    assert settings.anthropic.thinking_enabled and settings.anthropic.thinking_budget_tokens == 2048
    assert settings.azure is not None and settings.azure.azure_deployment == "d"
    assert not [k for k in settings.ignored_keys if k.startswith(("anthropic.", "azure"))]


# --- reasoning on the wire ---------------------------------------------------------------------


def llm_request(*messages: Message, tools: list[ToolSpec] | None = None) -> LlmRequest:
    return LlmRequest(
        agent="test",
        model="ignored",
        call_index=1,
        instruction=None,
        messages=list(messages) or [Message.user("hi")],
        tools=tools or [],
    )


def ref(model: str) -> ModelRef:
    return installed_providers().resolve(model)


async def test_openai_gets_the_effort_as_reasoning_effort(fake: FakeModelApi) -> None:
    provider = OpenAIProvider(
        ProviderSettings(api_key=KEY, base_url=fake.base_url_openai), generic=False, timeout=5
    )
    fake.script(Reply.text("a", thinking="because"), Reply.text("b"), Reply.text("c"), api="openai")
    try:
        reply = await provider.complete_model(llm_request(), ref("gpt-5-mini?reasoning=low"))
        await provider.complete_model(llm_request(), ref("openai.o3.high"))
        await provider.complete_model(llm_request(), ref("openai.gpt-5-mini"))
    finally:
        await provider.aclose()
    low, high, unset = (r.body for r in fake.requests_for("openai"))
    assert (low["model"], low["reasoning_effort"]) == ("gpt-5-mini", "low")
    assert (high["model"], high["reasoning_effort"]) == ("o3", "high")
    assert "reasoning_effort" not in unset
    assert reply.channels is not None
    assert reply.channels["reasoning"] == [TextContent(text="because")]


WEATHER = ToolSpec(name="weather__now", description="Weather", input_schema={"type": "object"})


@pytest.mark.parametrize(
    ("model", "thinking", "max_tokens"),
    [
        # Budget models: fast-agent's effort -> budget presets, max_tokens raised past it.
        ("claude-sonnet-4-5?reasoning=low", {"type": "enabled", "budget_tokens": 1024}, 4096),
        ("claude-sonnet-4-5.medium", {"type": "enabled", "budget_tokens": 16_000}, 24_192),
        ("claude-opus-4-1?reasoning=high", {"type": "enabled", "budget_tokens": 32_000}, 40_192),
        ("claude-opus-4-1?reasoning=3000", {"type": "enabled", "budget_tokens": 3000}, 4096),
        ("claude-opus-4-1?reasoning=off", None, 4096),
        # Adaptive models take the effort itself.
        ("sonnet?reasoning=high", {"type": "adaptive"}, 4096),
        ("opus?reasoning=off", {"type": "disabled"}, 4096),
        # No setting and thinking off in the config: none.
        ("claude-sonnet-4-5", None, 4096),
    ],
)
async def test_anthropic_reasoning_becomes_extended_thinking(
    model: str, thinking: dict[str, Any] | None, max_tokens: int, fake: FakeModelApi
) -> None:
    provider = AnthropicProvider(
        ProviderSettings(api_key=KEY, base_url=fake.base_url_anthropic), timeout=5
    )
    fake.script(Reply.text("ok"), api="anthropic")
    try:
        await provider.complete_model(llm_request(tools=[WEATHER]), ref(model))
    finally:
        await provider.aclose()
    (sent,) = fake.requests_for("anthropic")
    assert sent.body.get("thinking") == thinking
    assert sent.body["max_tokens"] == max_tokens
    effort = "high" if model == "sonnet?reasoning=high" else None
    assert sent.body.get("output_config", {}).get("effort") == effort
    # Interleaved thinking between tool calls, for budget thinking with tools.
    interleaved = thinking is not None and thinking["type"] == "enabled"
    assert ("interleaved-thinking" in sent.headers.get("anthropic-beta", "")) == interleaved


async def test_config_thinking_and_its_blocks_go_back_signed(fake: FakeModelApi) -> None:
    settings = AnthropicSettings(
        api_key=KEY,
        base_url=fake.base_url_anthropic,
        thinking_enabled=True,
        thinking_budget_tokens=2048,
    )
    provider = AnthropicProvider(settings, timeout=5)
    fake.script(Reply.text("first", thinking="let me think"), Reply.text("second"), api="anthropic")
    try:
        first = await provider.complete_model(llm_request(), ref("claude-haiku-4-5"))
        follow_up = llm_request(Message.user("hi"), first, Message.user("and?"))
        await provider.complete_model(follow_up, ref("claude-haiku-4-5"))
        # Claude models without thinking get none, whatever the config says.
        fake.script(Reply.text("third"), api="anthropic")
        await provider.complete_model(llm_request(), ref("claude-3-5-haiku-latest"))
    finally:
        await provider.aclose()

    one, two, three = (r.body for r in fake.requests_for("anthropic"))
    assert one["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert one["max_tokens"] == 4096
    assert "thinking" not in three
    # The reasoning channel holds the text; the raw block (signature) goes back as it came.
    assert first.channels is not None
    assert first.channels["reasoning"] == [TextContent(text="let me think")]
    (raw,) = first.channels[THINKING_BLOCKS]
    block = {"type": "thinking", "thinking": "let me think", "signature": "sig"}
    assert isinstance(raw, TextContent) and json.loads(raw.text) == block
    assert two["messages"][1] == {
        "role": "assistant",
        "content": [block, {"type": "text", "text": "first"}],
    }


def test_a_reasoning_setting_is_frozen_and_prints_as_written() -> None:
    assert str(Reasoning(kind="toggle", value=False)) == "off"
    assert str(ModelRef("openai", "o3", Reasoning(kind="effort", value="high"))) == (
        "openai.o3?reasoning=high"
    )
    with pytest.raises(ValueError):
        Reasoning(kind="effort", value="low").value = "high"  # type: ignore[misc]
