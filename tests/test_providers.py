"""The Anthropic and OpenAI adapters against a fake API over real HTTP, through the real SDKs."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.conftest import write_script
from turnkeep.config.settings import ProviderSettings
from turnkeep.contract.activity_io import ToolSpec
from turnkeep.contract.messages import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    Message,
    ResourceLink,
    StopReason,
    TextContent,
    ToolCall,
)
from turnkeep.contract.model_io import LlmRequest
from turnkeep.providers.anthropic import AnthropicProvider
from turnkeep.providers.base import ModelProvider
from turnkeep.providers.errors import request_timeout
from turnkeep.providers.openai import OpenAIProvider
from turnkeep.providers.passthrough import PassthroughProvider
from turnkeep.providers.playback import PlaybackProvider
from turnkeep.testing.fake_api import Api, FakeModelApi, Reply, Step, Tokens

KEY = "sk-test-NEVER-LOG-ME-7f3a9c"
PNG = "iVBORw0KGgo="
WEATHER = ToolSpec(
    name="weather__forecast",
    description="Forecast for a city",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)
HISTORY = [
    Message.user("Weather in Paris and Rome?"),
    Message(
        role="assistant",
        content=[TextContent(text="Checking both.")],
        tool_calls={
            "call_1": ToolCall(name="weather__forecast", arguments={"city": "Paris"}),
            "call_2": ToolCall(name="weather__forecast", arguments={"city": "Rome"}),
        },
        stop_reason=StopReason.TOOL_USE,
    ),
    Message(
        role="user",
        tool_results={
            "call_1": CallToolResult(
                content=[TextContent(text="Sunny"), ImageContent(data=PNG, mime_type="image/png")]
            ),
            "call_2": CallToolResult.error("Error: upstream timeout"),
        },
    ),
]


def make_provider(api: str, fake: FakeModelApi, timeout: float = 5.0) -> Any:
    if api == "anthropic":
        settings = ProviderSettings(api_key=KEY, base_url=fake.base_url_anthropic)
        return AnthropicProvider(settings, timeout=timeout)
    settings = ProviderSettings(api_key=KEY, base_url=fake.base_url_openai)
    return OpenAIProvider(settings, generic=api == "generic", timeout=timeout)


@pytest.fixture
async def anthropic(fake: FakeModelApi) -> AsyncIterator[AnthropicProvider]:
    provider = make_provider("anthropic", fake)
    yield provider
    await provider.aclose()


@pytest.fixture
async def openai(fake: FakeModelApi) -> AsyncIterator[OpenAIProvider]:
    provider = make_provider("openai", fake)
    yield provider
    await provider.aclose()


@pytest.fixture(params=["anthropic", "openai"])
async def either(request: pytest.FixtureRequest, fake: FakeModelApi) -> AsyncIterator[Any]:
    """(api, provider) for behaviour both adapters share."""
    provider = make_provider(request.param, fake)
    yield request.param, provider
    await provider.aclose()


def llm_request(*messages: Message, **fields: Any) -> LlmRequest:
    return LlmRequest(
        agent="test",
        model="ignored",
        call_index=1,
        instruction=fields.pop("instruction", None),
        messages=list(messages) or [Message.user("hi")],
        tools=fields.pop("tools", []),
        **fields,
    )


def usage(message: Message) -> dict[str, int]:
    return dict(message.channel_json("usage"))


async def failure(provider: ModelProvider, fake: FakeModelApi, *steps: Step) -> ApplicationError:
    """The error a call raises when the fake answers with ``steps``; never with the key in it."""
    fake.script(*steps)
    with pytest.raises(ApplicationError) as caught:
        await provider.complete(llm_request(), "model-x")
    assert KEY not in str(caught.value)
    assert caught.value.__cause__ is None  # the SDK error (and its text) stays out of history
    return caught.value


# --- Anthropic --------------------------------------------------------------------------------


async def test_anthropic_text_answer(anthropic: AnthropicProvider, fake: FakeModelApi) -> None:
    fake.script(
        Reply.text("Hello!", usage=Tokens(input=100, output=20, cache_read=30, cache_write=40))
    )

    reply = await anthropic.complete(
        llm_request(Message.user("hi"), instruction="You are terse.", temperature=0.3),
        "claude-test",
    )

    assert reply.role == "assistant"
    assert reply.text == "Hello!"
    assert reply.stop_reason == StopReason.END_TURN
    assert reply.tool_calls is None
    assert usage(reply) == {
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_read_tokens": 30,
        "cache_write_tokens": 40,
    }
    (sent,) = fake.requests_for("anthropic")
    # No temperature: the SDK's API version rejects sampling parameters.
    assert sent.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    assert sent.headers["authorization"] == f"Bearer {KEY}"


async def test_anthropic_parallel_tool_calls(
    anthropic: AnthropicProvider, fake: FakeModelApi
) -> None:
    fake.script(
        Reply.tool_calls(
            ("toolu_1", "weather__forecast", {"city": "Paris"}),
            ("toolu_2", "weather__forecast", {"city": "Rome"}),
            text="Let me check.",
        )
    )

    reply = await anthropic.complete(llm_request(tools=[WEATHER], max_tokens=123), "claude-test")

    assert reply.stop_reason == StopReason.TOOL_USE
    assert reply.text == "Let me check."
    assert reply.tool_calls == {
        "toolu_1": ToolCall(name="weather__forecast", arguments={"city": "Paris"}),
        "toolu_2": ToolCall(name="weather__forecast", arguments={"city": "Rome"}),
    }
    (sent,) = fake.requests_for("anthropic")
    assert sent.body["max_tokens"] == 123
    assert sent.body["tools"] == [
        {
            "name": "weather__forecast",
            "description": "Forecast for a city",
            "input_schema": WEATHER.input_schema,
        }
    ]


async def test_anthropic_history_conversion(
    anthropic: AnthropicProvider, fake: FakeModelApi
) -> None:
    fake.script(Reply.text("Paris is sunny; Rome did not answer."))

    await anthropic.complete(llm_request(*HISTORY, tools=[WEATHER]), "claude-test")

    (sent,) = fake.requests_for("anthropic")
    assert sent.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking both."},
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "weather__forecast",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "call_2",
                    "name": "weather__forecast",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": [
                        {"type": "text", "text": "Sunny"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        },
                    ],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": [{"type": "text", "text": "Error: upstream timeout"}],
                    "is_error": True,
                },
            ],
        },
    ]


async def test_anthropic_thinking_goes_to_the_reasoning_channel(
    anthropic: AnthropicProvider, fake: FakeModelApi
) -> None:
    fake.script(Reply.text("42", thinking="6 times 7"))

    reply = await anthropic.complete(llm_request(), "claude-test")

    assert reply.text == "42"
    assert reply.channels is not None
    assert reply.channels["reasoning"] == [TextContent(text="6 times 7")]


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        ("max_tokens", StopReason.MAX_TOKENS),
        ("stop_sequence", StopReason.STOP_SEQUENCE),
        ("pause_turn", StopReason.PAUSE),
        ("refusal", StopReason.SAFETY),
        ("model_context_window_exceeded", StopReason.MAX_TOKENS),
    ],
)
async def test_anthropic_stop_reasons(
    anthropic: AnthropicProvider, fake: FakeModelApi, stop: str, expected: StopReason
) -> None:
    fake.script(Reply.text("…", stop=stop))

    reply = await anthropic.complete(llm_request(), "claude-test")

    assert reply.stop_reason == expected


async def test_anthropic_structured_output_is_asked_for_in_the_system_prompt(
    anthropic: AnthropicProvider, fake: FakeModelApi
) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    fake.script(Reply.text('{"answer": 42}'))

    reply = await anthropic.complete(
        llm_request(instruction="Be exact.", structured_output=schema), "claude-test"
    )

    assert reply.text == '{"answer": 42}'
    system = fake.requests_for("anthropic")[0].body["system"]
    assert system.startswith("Be exact.\n\n")
    assert "JSON Schema" in system
    assert '"answer": {\n      "type": "integer"' in system


async def test_anthropic_flattens_what_it_cannot_send_as_is(
    anthropic: AnthropicProvider, fake: FakeModelApi
) -> None:
    fake.script(Reply.text("ok"))
    attached = Message(
        role="user",
        content=[
            EmbeddedResource(resource={"uri": "file:///notes.md", "text": "# Notes"}),
            ResourceLink(uri="file:///big.csv", name="big.csv"),
        ],
        tool_results={"call_1": CallToolResult(structured_content={"temp": 21})},
    )

    await anthropic.complete(llm_request(attached), "claude-test")

    (sent,) = fake.requests_for("anthropic")
    assert sent.body["messages"] == [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": [{"type": "text", "text": '{"temp": 21}'}],
                },
                {"type": "text", "text": "# Notes"},
                {"type": "text", "text": "[resource link: big.csv file:///big.csv]"},
            ],
        }
    ]


async def test_messages_without_content_are_left_out(
    either: tuple[Api, ModelProvider], fake: FakeModelApi
) -> None:
    api, provider = either
    fake.script(Reply.text("ok"))
    failed = Message(
        role="assistant",
        stop_reason=StopReason.ERROR,
        channels={"error": [TextContent(text="anthropic 500: boom")]},
    )

    await provider.complete(
        llm_request(Message.user("hi"), failed, Message.user("again")), "model-x"
    )

    (sent,) = fake.requests_for(api)
    assert [m["role"] for m in sent.body["messages"]] == ["user", "user"]


# --- every provider ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["anthropic", "openai", "generic", "passthrough", "playback"])
async def test_no_provider_changes_the_request_it_sends(
    api: str, fake: FakeModelApi, tmp_path: Path
) -> None:
    # The model calls of a turn on one worker share the Message objects they send
    # (``turnkeep.providers.parsed_messages``): a provider that changed one would change later
    # calls.
    attached = Message(
        role="user",
        content=[
            EmbeddedResource(resource={"uri": "file:///notes.md", "text": "# Notes"}),
            ResourceLink(uri="file:///big.csv", name="big.csv"),
            TextContent(text="and the notes"),
        ],
        tool_results={"call_9": CallToolResult(structured_content={"temp": 21})},
    )
    request = llm_request(
        *HISTORY,
        attached,
        instruction="Be exact.",
        tools=[WEATHER],
        structured_output={"type": "object", "properties": {"a": {"type": "string"}}},
        temperature=0.3,
        max_tokens=99,
    )
    before = request.model_dump()
    provider: ModelProvider
    if api == "passthrough":
        provider = PassthroughProvider()
    elif api == "playback":
        script = write_script(tmp_path / "script.json", "scripted")
        provider = PlaybackProvider(script)
    else:
        fake.script(Reply.text("ok"))
        provider = make_provider(api, fake)
    try:
        await provider.complete(request, "model-x")
    finally:
        await provider.aclose()
    assert request.model_dump() == before


# --- OpenAI -----------------------------------------------------------------------------------


async def test_openai_text_answer(openai: OpenAIProvider, fake: FakeModelApi) -> None:
    fake.script(Reply.text("Hello!", usage=Tokens(input=100, output=20, cache_read=30)))

    reply = await openai.complete(
        llm_request(instruction="You are terse.", temperature=0.2, max_tokens=50), "gpt-test"
    )

    assert reply.text == "Hello!"
    assert reply.stop_reason == StopReason.END_TURN
    # OpenAI counts cached prompt tokens in prompt_tokens; turnkeep counts them apart.
    assert usage(reply) == {
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_read_tokens": 30,
        "cache_write_tokens": 0,
    }
    (sent,) = fake.requests_for("openai")
    assert sent.body == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hi"},
        ],
        "temperature": 0.2,
        "max_completion_tokens": 50,
    }
    assert sent.headers["authorization"] == f"Bearer {KEY}"


async def test_openai_parallel_tool_calls(openai: OpenAIProvider, fake: FakeModelApi) -> None:
    fake.script(
        Reply.tool_calls(
            ("call_a", "weather__forecast", {"city": "Paris"}),
            ("call_b", "weather__forecast", {"city": "Rome"}),
        )
    )

    reply = await openai.complete(llm_request(tools=[WEATHER]), "gpt-test")

    assert reply.stop_reason == StopReason.TOOL_USE
    assert reply.content == []
    assert reply.tool_calls == {
        "call_a": ToolCall(name="weather__forecast", arguments={"city": "Paris"}),
        "call_b": ToolCall(name="weather__forecast", arguments={"city": "Rome"}),
    }
    (sent,) = fake.requests_for("openai")
    assert sent.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather__forecast",
                "description": "Forecast for a city",
                "parameters": WEATHER.input_schema,
            },
        }
    ]
    assert "parallel_tool_calls" not in sent.body


async def test_openai_history_conversion(openai: OpenAIProvider, fake: FakeModelApi) -> None:
    fake.script(Reply.text("Paris is sunny; Rome did not answer."))

    await openai.complete(llm_request(*HISTORY, instruction="You are terse."), "gpt-test")

    (sent,) = fake.requests_for("openai")
    assert sent.body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather__forecast", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "weather__forecast", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Error: upstream timeout"},
        # Tool messages carry text only: the image follows in a user message.
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Image(s) returned by tool call call_1:"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
    ]


@pytest.mark.parametrize("raw", ['{"city": "Par', "[1, 2]", '"Paris"'])
async def test_openai_tool_arguments_that_are_not_an_object(
    openai: OpenAIProvider, fake: FakeModelApi, raw: str
) -> None:
    fake.script(Reply.tool_calls(("call_1", "weather__forecast", raw)))

    reply = await openai.complete(llm_request(tools=[WEATHER]), "gpt-test")

    assert reply.stop_reason == StopReason.TOOL_USE
    assert reply.tool_calls == {"call_1": ToolCall(name="weather__forecast", invalid_arguments=raw)}


async def test_openai_empty_tool_arguments_mean_none(
    openai: OpenAIProvider, fake: FakeModelApi
) -> None:
    fake.script(Reply.tool_calls(("call_1", "clock__now", "")))

    reply = await openai.complete(llm_request(), "gpt-test")

    assert reply.tool_calls == {"call_1": ToolCall(name="clock__now", arguments={})}


@pytest.mark.parametrize(
    ("finish", "expected"),
    [("length", StopReason.MAX_TOKENS), ("content_filter", StopReason.SAFETY)],
)
async def test_openai_finish_reasons(
    openai: OpenAIProvider, fake: FakeModelApi, finish: str, expected: StopReason
) -> None:
    fake.script(Reply.text("…", stop=finish))

    reply = await openai.complete(llm_request(), "gpt-test")

    assert reply.stop_reason == expected


async def test_openai_refusal_is_a_safety_stop(openai: OpenAIProvider, fake: FakeModelApi) -> None:
    message = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    fake.script(Reply.raw(200, completion(message, "stop")))

    reply = await openai.complete(llm_request(), "gpt-test")

    assert reply.stop_reason == StopReason.SAFETY
    assert reply.text == "I can't help with that."


async def test_openai_structured_output_uses_response_format(
    openai: OpenAIProvider, fake: FakeModelApi
) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    fake.script(Reply.text('{"answer": 42}'))

    await openai.complete(llm_request(structured_output=schema), "gpt-test")

    assert fake.requests_for("openai")[0].body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "final_answer", "schema": schema, "strict": False},
    }


async def test_generic_reasoning_and_parameters(
    fake: FakeModelApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GENERIC_API_KEY", raising=False)
    provider = OpenAIProvider(
        ProviderSettings(base_url=fake.base_url_openai), generic=True, timeout=5
    )
    fake.script(Reply.text("4", thinking="2 + 2"))

    try:
        reply = await provider.complete(llm_request(max_tokens=64), "llama3")
    finally:
        await provider.aclose()

    assert reply.text == "4"
    assert reply.channels is not None
    assert reply.channels["reasoning"] == [TextContent(text="2 + 2")]
    (sent,) = fake.requests_for("openai")
    assert sent.headers["authorization"] == "Bearer ollama"  # local servers ignore it
    assert sent.body["max_tokens"] == 64  # what compatible servers understand
    assert "max_completion_tokens" not in sent.body


def completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-raw",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "config_key", "env_var"),
    [
        (lambda: AnthropicProvider(None), "anthropic.api_key", "ANTHROPIC_API_KEY"),
        (lambda: OpenAIProvider(None, generic=False), "openai.api_key", "OPENAI_API_KEY"),
    ],
)
def test_missing_api_key(
    monkeypatch: pytest.MonkeyPatch, make: Any, config_key: str, env_var: str
) -> None:
    monkeypatch.delenv(env_var, raising=False)

    with pytest.raises(ApplicationError) as caught:
        make()

    assert caught.value.type == "MissingApiKey"
    assert caught.value.non_retryable
    assert config_key in caught.value.message
    assert env_var in caught.value.message


async def test_key_and_base_url_from_the_environment(
    fake: FakeModelApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url_anthropic)
    provider = AnthropicProvider(ProviderSettings(), timeout=5)
    fake.script(Reply.text("ok"))

    try:
        assert (await provider.complete(llm_request(), "claude-test")).text == "ok"
    finally:
        await provider.aclose()

    assert fake.requests_for("anthropic")[0].headers["authorization"] == "Bearer sk-from-env"


async def test_request_timeout_follows_the_activity() -> None:
    assert request_timeout() == 600.0  # outside an activity

    async def seen(start_to_close: timedelta | None) -> float:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, start_to_close_timeout=start_to_close)
        return await env.run(_async_request_timeout)

    assert await seen(timedelta(seconds=600)) == 590.0
    assert await seen(timedelta(seconds=30)) == 27.0
    assert await seen(None) == 600.0


async def _async_request_timeout() -> float:
    return request_timeout()


# --- failures (both providers) ----------------------------------------------------------------


def in_30_seconds() -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)


@pytest.mark.parametrize(
    ("headers", "low", "high"),
    [
        ({"retry-after": "2"}, 2.0, 2.0),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5, 1.5),
        ({"retry-after": in_30_seconds}, 25.0, 30.0),  # an HTTP date, made when the test runs
    ],
)
async def test_rate_limit_honours_retry_after(
    either: tuple[Api, ModelProvider],
    fake: FakeModelApi,
    headers: dict[str, Any],
    low: float,
    high: float,
) -> None:
    api, provider = either
    sent = {name: value() if callable(value) else value for name, value in headers.items()}
    err = await failure(provider, fake, Reply.error(429, "Rate limit reached", headers=sent))

    assert err.type == "ProviderRateLimited"
    assert not err.non_retryable
    assert err.next_retry_delay is not None
    assert low <= err.next_retry_delay.total_seconds() <= high
    assert err.message.startswith(f"{api} 429: Rate limit reached (request req_fake_")


async def test_rate_limit_without_retry_after_leaves_backoff_to_temporal(
    either: tuple[Api, ModelProvider], fake: FakeModelApi
) -> None:
    _, provider = either
    err = await failure(provider, fake, Reply.error(429, "slow down"))

    assert not err.non_retryable
    assert err.next_retry_delay is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (500, "ProviderServerError"),
        (503, "ProviderServerError"),
        (529, "ProviderOverloaded"),
        (408, "ProviderTimeout"),
        (409, "ProviderConflict"),
    ],
)
async def test_retryable_statuses(
    either: tuple[Api, ModelProvider], fake: FakeModelApi, status: int, kind: str
) -> None:
    api, provider = either
    err = await failure(
        provider, fake, Reply.error(status, "try later", headers={"retry-after": "3"})
    )

    assert err.type == kind
    assert not err.non_retryable
    assert err.next_retry_delay == timedelta(seconds=3)
    assert f"{api} {status}: try later" in err.message


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "ProviderBadRequest"),
        (401, "ProviderAuthentication"),
        (403, "ProviderPermissionDenied"),
        (404, "ProviderNotFound"),
        (413, "ProviderRequestTooLarge"),
        (422, "ProviderUnprocessable"),
        (402, "ProviderClientError"),
    ],
)
async def test_non_retryable_statuses(
    either: tuple[Api, ModelProvider], fake: FakeModelApi, status: int, kind: str
) -> None:
    api, provider = either
    err = await failure(provider, fake, Reply.error(status, "you did it wrong"))

    assert err.type == kind
    assert err.non_retryable
    assert err.message.startswith(f"{api} {status}: you did it wrong")


@pytest.mark.parametrize(
    "said",
    [
        "prompt is too long: 208000 tokens > 200000 maximum",
        "This model's maximum context length is 128000 tokens. However, you requested 130000.",
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000",
    ],
)
async def test_context_length_is_not_retried(
    either: tuple[Api, ModelProvider], fake: FakeModelApi, said: str
) -> None:
    _, provider = either
    err = await failure(provider, fake, Reply.error(400, said))

    assert err.type == "ContextLengthExceeded"
    assert err.non_retryable
    assert said in err.message


async def test_dropped_connection_is_retryable(
    either: tuple[Api, ModelProvider], fake: FakeModelApi
) -> None:
    api, provider = either
    err = await failure(provider, fake, Reply.drop())

    assert err.type == "ProviderConnectionError"
    assert not err.non_retryable
    assert err.message.startswith(f"{api}: connection failed")


async def test_refused_connection_is_retryable() -> None:
    with FakeModelApi() as gone:
        settings = ProviderSettings(api_key=KEY, base_url=gone.base_url_openai)
    provider = OpenAIProvider(settings, generic=False, timeout=5)
    try:
        with pytest.raises(ApplicationError) as caught:
            await provider.complete(llm_request(), "gpt-test")
    finally:
        await provider.aclose()

    assert caught.value.type == "ProviderConnectionError"
    assert not caught.value.non_retryable


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_no_answer_within_the_request_timeout(fake: FakeModelApi, api: Api) -> None:
    provider = make_provider(api, fake, timeout=0.3)
    started = time.monotonic()
    try:
        err = await failure(provider, fake, Reply.delay(30, then=Reply.text("too late")))
    finally:
        await provider.aclose()

    assert time.monotonic() - started < 3
    assert err.type == "ProviderTimeout"
    assert not err.non_retryable
    assert err.message == f"{api}: no answer within 0.3 s"


@pytest.mark.parametrize(
    "step",
    [
        Reply.raw(200, "{not json"),
        Reply.raw(200, "<html>gateway</html>", content_type="text/html"),
        Reply.raw(200, {"unexpected": True}),
    ],
    ids=["bad-json", "html", "wrong-shape"],
)
async def test_unreadable_response(
    either: tuple[Api, ModelProvider], fake: FakeModelApi, step: Step
) -> None:
    api, provider = either
    err = await failure(provider, fake, step)

    assert err.type == "ProviderResponseInvalid"
    assert err.non_retryable
    assert err.message.startswith(f"{api}: unreadable response")


async def test_api_key_is_redacted_from_error_messages(
    either: tuple[Api, ModelProvider], fake: FakeModelApi
) -> None:
    _, provider = either
    said = f"Incorrect API key provided: {KEY}"
    err = await failure(provider, fake, Reply.error(401, said))  # asserts KEY is absent

    assert err.type == "ProviderAuthentication"
    assert "Incorrect API key provided: [redacted]" in err.message
