"""The OpenAI-compatible providers (DeepSeek, OpenRouter, Groq, xAI, Google, Azure OpenAI)
through the real ``openai`` SDK against the fake API on loopback, each on its own base URL path
and behind its own auth header, which the fake server checks."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from tests.conftest import HarnessFactory, history_text
from turnkeep.config.settings import AzureSettings, ProviderSettings, Settings
from turnkeep.contract.messages import Message, TextContent
from turnkeep.contract.model_io import LlmRequest
from turnkeep.fastagent.model_strings import ModelRef, Reasoning
from turnkeep.providers import openai_compat
from turnkeep.providers.azure import AzureProvider
from turnkeep.providers.openai_compat import (
    OPENAI_COMPATIBLE_PROVIDERS,
    DeepSeekProvider,
    GoogleProvider,
    GroqProvider,
    OpenAICompatibleProvider,
    OpenRouterProvider,
    XaiProvider,
)
from turnkeep.providers.registry import ModelCatalog, installed_providers
from turnkeep.testing.fake_api import FakeModelApi, Reply

KEY = "sk-compat-NEVER-LOG-ME-51c0de"
WRONG_KEY = "sk-wrong-ALSO-SECRET-9e8d7c"

# Each provider under a path of its own, ending as its real base URL does.
PATHS: dict[type[OpenAICompatibleProvider], str] = {
    DeepSeekProvider: "/deepseek",  # https://api.deepseek.com
    OpenRouterProvider: "/openrouter/api/v1",
    GroqProvider: "/groq/openai/v1",
    XaiProvider: "/xai/v1",
    GoogleProvider: "/google/v1beta/openai",
    AzureProvider: "/azure",  # https://<resource>.openai.azure.com
}
PROVIDERS = list(PATHS)
DEFAULT_URLS = {
    DeepSeekProvider: "https://api.deepseek.com",
    OpenRouterProvider: "https://openrouter.ai/api/v1",
    GroqProvider: "https://api.groq.com/openai/v1",
    XaiProvider: "https://api.x.ai/v1",
    GoogleProvider: "https://generativelanguage.googleapis.com/v1beta/openai",
}
ENV_KEYS = {
    DeepSeekProvider: "DEEPSEEK_API_KEY",
    OpenRouterProvider: "OPENROUTER_API_KEY",
    GroqProvider: "GROQ_API_KEY",
    XaiProvider: "XAI_API_KEY",
    GoogleProvider: "GOOGLE_API_KEY",
    AzureProvider: "AZURE_API_KEY",
}
ids = [p.name for p in PROVIDERS]


@pytest.mark.parametrize("cls", OPENAI_COMPATIBLE_PROVIDERS, ids=lambda c: c.name)
def test_each_table_class_is_named_and_bound_by_its_key(
    cls: type[OpenAICompatibleProvider],
) -> None:
    """The classes made from the table read as named classes (in errors) and pickle."""
    assert cls.__qualname__ == cls.__name__ and cls.__name__.endswith("Provider")
    assert getattr(openai_compat, cls.__name__) is cls
    assert pickle.loads(pickle.dumps(cls)) is cls
    assert cls is openai_compat.PROVIDER_CLASSES[cls.name]


@pytest.fixture(autouse=True)
def no_keys_in_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for env in (*ENV_KEYS.values(), "OPENROUTER_BASE_URL"):
        monkeypatch.delenv(env, raising=False)
    yield


def auth(cls: type[OpenAICompatibleProvider]) -> tuple[str, str]:
    # Azure takes its key in `api-key`; the others as a bearer token.
    return ("api-key", KEY) if cls is AzureProvider else ("authorization", f"Bearer {KEY}")


def settings_for(
    cls: type[OpenAICompatibleProvider], base_url: str | None, key: str | None = KEY
) -> ProviderSettings:
    if cls is AzureProvider:
        return AzureSettings(
            api_key=key, base_url=base_url, azure_deployment="dep-default", api_version="2024-10-21"
        )
    return ProviderSettings(api_key=key, base_url=base_url)


def make(
    cls: type[OpenAICompatibleProvider], fake: FakeModelApi, key: str | None = KEY
) -> OpenAICompatibleProvider:
    base_url = fake.mount(PATHS[cls], auth=auth(cls))
    return cls(settings_for(cls, base_url, key), timeout=5)


def expected_path(cls: type[OpenAICompatibleProvider], model: str) -> str:
    if cls is AzureProvider:  # the deployment in the path, the API version in the query
        return f"/azure/openai/deployments/{model}/chat/completions?api-version=2024-10-21"
    return f"{PATHS[cls]}/chat/completions"


def request() -> LlmRequest:
    return LlmRequest(
        agent="test",
        model="ignored",
        call_index=1,
        instruction="Be brief.",
        messages=[Message.user("hi")],
        tools=[],
        max_tokens=50,
    )


@pytest.mark.parametrize("cls", PROVIDERS, ids=ids)
async def test_answers_on_its_own_path_behind_its_auth_header(
    cls: type[OpenAICompatibleProvider], fake: FakeModelApi
) -> None:
    provider = make(cls, fake)
    fake.script(Reply.text("hello", thinking="greeting back"))
    try:
        reply = await provider.complete_model(request(), ModelRef(cls.name, "model-x"))
    finally:
        await provider.aclose()

    assert reply.text == "hello"
    assert reply.channels is not None
    assert reply.channels["reasoning"] == [TextContent(text="greeting back")]
    (sent,) = fake.requests_for("openai")
    assert sent.path == expected_path(cls, "model-x")
    name, value = auth(cls)
    assert sent.headers[name] == value
    assert sent.body["model"] == "model-x"
    assert sent.body["messages"][0] == {"role": "system", "content": "Be brief."}
    # Azure is OpenAI's own API; the others take the max_tokens compatible servers know.
    tokens = "max_completion_tokens" if cls is AzureProvider else "max_tokens"
    assert sent.body[tokens] == 50
    assert "reasoning_effort" not in sent.body


@pytest.mark.parametrize("cls", PROVIDERS, ids=ids)
async def test_a_rate_limit_is_retryable_after_what_the_server_asked(
    cls: type[OpenAICompatibleProvider], fake: FakeModelApi
) -> None:
    provider = make(cls, fake)
    fake.script(Reply.error(429, "Rate limit reached", headers={"retry-after": "3"}))
    try:
        with pytest.raises(ApplicationError) as caught:
            await provider.complete_model(request(), ModelRef(cls.name, "model-x"))
    finally:
        await provider.aclose()

    error = caught.value
    assert error.type == "ProviderRateLimited" and not error.non_retryable
    assert error.next_retry_delay == timedelta(seconds=3)
    assert error.message.startswith(f"{cls.name} 429: Rate limit reached")


@pytest.mark.parametrize("cls", PROVIDERS, ids=ids)
async def test_a_refused_key_is_final_and_named_by_provider_never_shown(
    cls: type[OpenAICompatibleProvider], fake: FakeModelApi
) -> None:
    provider = make(cls, fake, key=WRONG_KEY)  # the fake server wants KEY
    fake.script(Reply.text("never sent"))
    try:
        with pytest.raises(ApplicationError) as caught:
            await provider.complete_model(request(), ModelRef(cls.name, "model-x"))
    finally:
        await provider.aclose()

    error = caught.value
    assert error.type == "ProviderAuthentication" and error.non_retryable
    assert cls.display_name in error.message and f"{cls.name} 401" in error.message
    assert f"`{cls.name}.api_key`" in error.message and ENV_KEYS[cls] in error.message
    assert WRONG_KEY not in error.message and KEY not in error.message
    assert fake.pending("openai") == 1  # refused at the door: no step was used


@pytest.mark.parametrize("cls", PROVIDERS, ids=ids)
async def test_the_key_comes_from_fast_agents_environment_variable(
    cls: type[OpenAICompatibleProvider], fake: FakeModelApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ApplicationError) as caught:
        cls(settings_for(cls, "http://127.0.0.1:9", key=None))
    assert caught.value.type == "MissingApiKey" and caught.value.non_retryable
    assert f"`{cls.name}.api_key`" in caught.value.message
    assert ENV_KEYS[cls] in caught.value.message

    monkeypatch.setenv(ENV_KEYS[cls], KEY)
    base_url = fake.mount(PATHS[cls], auth=auth(cls))
    provider = cls(settings_for(cls, base_url, key=None), timeout=5)
    fake.script(Reply.text("from env"))
    try:
        reply = await provider.complete_model(request(), ModelRef(cls.name, "m"))
    finally:
        await provider.aclose()
    assert reply.text == "from env"


@pytest.mark.parametrize("cls", list(DEFAULT_URLS), ids=[c.name for c in DEFAULT_URLS])
async def test_default_base_urls_are_fast_agents(cls: type[OpenAICompatibleProvider]) -> None:
    provider = cls(ProviderSettings(api_key=KEY))
    try:
        assert str(provider._client.base_url).rstrip("/") == DEFAULT_URLS[cls]
    finally:
        await provider.aclose()


async def test_openrouter_base_url_from_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENROUTER_BASE_URL", "https://gateway.example/api/v1")
    provider = OpenRouterProvider(ProviderSettings(api_key=KEY))
    try:
        assert str(provider._client.base_url) == "https://gateway.example/api/v1/"
    finally:
        await provider.aclose()


async def test_azure_endpoint_from_resource_name_and_bare_azure_is_the_configured_deployment(
    fake: FakeModelApi,
) -> None:
    provider = AzureProvider(AzureSettings(api_key=KEY, resource_name="contoso"))
    try:
        assert str(provider._client.base_url) == "https://contoso.openai.azure.com/openai/"
    finally:
        await provider.aclose()

    provider = make(AzureProvider, fake)
    fake.script(Reply.text("one"), Reply.text("two"))
    registry = installed_providers()
    try:
        await provider.complete_model(request(), registry.resolve("azure"))
        await provider.complete_model(request(), registry.resolve("azure.gpt4o-eu"))
    finally:
        await provider.aclose()
    first, second = fake.requests_for("openai")
    assert first.path == expected_path(AzureProvider, "dep-default")
    assert second.path == expected_path(AzureProvider, "gpt4o-eu")

    with pytest.raises(ApplicationError, match="resource_name") as caught:
        ModelCatalog(Settings.model_validate({"azure": {"api_key": KEY}})).check("azure.x")
    assert caught.value.type == "ModelNotConfigured"


@pytest.mark.parametrize(
    ("cls", "reasoning", "sent"),
    [
        (DeepSeekProvider, Reasoning(kind="effort", value="high"), "high"),
        (XaiProvider, Reasoning(kind="effort", value="low"), "low"),
        (AzureProvider, Reasoning(kind="toggle", value=False), "none"),
        (OpenRouterProvider, Reasoning(kind="effort", value="auto"), None),
        # Groq takes only default (thinking) or none, as fast-agent sends it.
        (GroqProvider, Reasoning(kind="effort", value="high"), "default"),
        (GroqProvider, Reasoning(kind="toggle", value=False), "none"),
    ],
)
async def test_a_reasoning_setting_is_sent_as_reasoning_effort(
    cls: type[OpenAICompatibleProvider],
    reasoning: Reasoning,
    sent: str | None,
    fake: FakeModelApi,
) -> None:
    provider = make(cls, fake)
    fake.script(Reply.text("ok"))
    try:
        await provider.complete_model(request(), ModelRef(cls.name, "m", reasoning))
    finally:
        await provider.aclose()
    (recorded,) = fake.requests_for("openai")
    assert recorded.body.get("reasoning_effort") == sent


def turn_config(fake: FakeModelApi, **agent: Any) -> dict[str, Any]:
    base_url = fake.mount(PATHS[DeepSeekProvider], auth=auth(DeepSeekProvider))
    timeouts = {"start_to_close": 30, "heartbeat": 5, "max_attempts": 3}
    return {
        "deepseek": {"api_key": KEY, "base_url": base_url},
        "agents": {"test": {"llm_timeouts": timeouts, **agent}},
    }


async def test_a_turn_on_deepseek_retries_a_rate_limit_and_keeps_the_key_out_of_history(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Reply.error(429, "Rate limit reached", headers={"retry-after": "1"}),
        Reply.text("done", thinking="thought about it"),
    )
    config = turn_config(fake, model="deepseek-chat?reasoning=high")
    async with harness(**config) as h:
        handle = await h.start("hi")
        result = await handle.result()
        history = await handle.handle.fetch_history()

    assert result.final is not None and result.final.text == "done"
    assert (result.final.channels or {})["reasoning"] == [TextContent(text="thought about it")]
    first, second = fake.requests_for("openai")
    assert first.path == second.path == "/deepseek/chat/completions"
    assert second.body["model"] == "deepseek-chat"
    assert second.body["reasoning_effort"] == "high"
    assert KEY not in history_text(history)
