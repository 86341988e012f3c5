"""Every provider that streams, against a server that does not stream as asked (issue #43):
through the real ``anthropic`` and ``openai`` SDKs, the fake API answers a streamed request
with the whole non-streamed body, or ends the stream cleanly without its closing event or
without its stop reason. A whole answer is the answer; a stream cut before its stop reason is
a non-retryable error that names the server and how to turn streaming off; never a bare
assertion."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from turnkeep.config.settings import AzureSettings, ProviderSettings
from turnkeep.contract.messages import Message, StopReason, ToolCall
from turnkeep.contract.model_io import LlmRequest
from turnkeep.fastagent.model_strings import ModelRef
from turnkeep.providers.anthropic import AnthropicProvider
from turnkeep.providers.azure import AzureProvider
from turnkeep.providers.base import ModelProvider
from turnkeep.providers.errors import classify
from turnkeep.providers.openai import OpenAIProvider
from turnkeep.providers.openai_compat import OPENAI_COMPATIBLE_PROVIDERS
from turnkeep.providers.stream_end import STREAM_INCOMPLETE
from turnkeep.providers.streaming import streaming_to
from turnkeep.testing.fake_api import FakeModelApi, Reply, Step, Tokens

KEY = "sk-stream-NEVER-LOG-ME-4d2e1b"
# Every provider with `streams`: its config key, and the API it speaks.
STREAMING = ["anthropic", "openai", "generic", *(c.name for c in OPENAI_COMPATIBLE_PROVIDERS)]
STREAMING.append("azure")


class Recorder:
    """A live stream: what the provider sent it, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, ...]] = []

    def text(self, text: str) -> None:
        self.sent.append(("text", text))

    def tool_call(self, name: str, call_id: str) -> None:
        self.sent.append(("tool_call", name, call_id))

    @property
    def text_sent(self) -> str:
        return "".join(item[1] for item in self.sent if item[0] == "text")


def make(name: str, fake: FakeModelApi, **settings: Any) -> ModelProvider:
    """The provider ``name`` on the fake API, its key in its own config block."""
    if name == "anthropic":
        block = ProviderSettings(api_key=KEY, base_url=fake.base_url_anthropic, **settings)
        return AnthropicProvider(block, timeout=5)
    if name == "azure":
        base_url = fake.mount("/azure/")
        azure = AzureSettings(api_key=KEY, base_url=base_url, api_version="2024-10-21", **settings)
        return AzureProvider(azure, timeout=5)
    block = ProviderSettings(api_key=KEY, base_url=fake.base_url_openai, **settings)
    if name in ("openai", "generic"):
        return OpenAIProvider(block, generic=name == "generic", timeout=5)
    (cls,) = [c for c in OPENAI_COMPATIBLE_PROVIDERS if c.name == name]
    return cls(block, timeout=5)


@pytest.fixture(params=STREAMING)
async def provider(request: pytest.FixtureRequest, fake: FakeModelApi) -> AsyncIterator[Any]:
    """(config key, provider) for each provider that streams."""
    made = make(request.param, fake)
    assert made.streams
    yield request.param, made
    await made.aclose()


@pytest.fixture(autouse=True)
def no_base_urls_in_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for env in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OPENROUTER_BASE_URL"):
        monkeypatch.delenv(env, raising=False)
    yield


def llm_request() -> LlmRequest:
    return LlmRequest(
        agent="test",
        model="ignored",
        call_index=1,
        instruction=None,
        messages=[Message.user("2+3?")],
        tools=[],
    )


async def streamed(
    name: str, provider: ModelProvider, fake: FakeModelApi, step: Step
) -> tuple[Message, Recorder]:
    """The provider's answer to ``step`` for a call made with a live stream, and the stream."""
    fake.script(step)
    live = Recorder()
    with streaming_to(live):
        answer = await provider.complete_model(llm_request(), ModelRef(name, "model-x"))
    (sent,) = fake.requests
    assert sent.body.get("stream") is True
    return answer, live


def usage(message: Message) -> dict[str, int]:
    return dict(message.channel_json("usage"))


THE_CALL = ("call_1", "math__add", {"a": 2, "b": 3})


@pytest.mark.parametrize("streamed_as", ["json", "no_done"])
async def test_a_whole_answer_is_the_answer(
    provider: tuple[str, ModelProvider], fake: FakeModelApi, streamed_as: Any
) -> None:
    """The whole non-streamed body, or a stream without its closing event: the answer the call
    made without streaming gets, its text and tool calls on the live stream."""
    name, made = provider
    step = Reply.tool_calls(
        THE_CALL, text="Adding.", usage=Tokens(input=12, output=7), streamed_as=streamed_as
    )
    answer, live = await streamed(name, made, fake, step)

    assert answer.text == "Adding."
    assert answer.tool_calls == {"call_1": ToolCall(name="math__add", arguments={"a": 2, "b": 3})}
    assert answer.stop_reason == StopReason.TOOL_USE
    assert live.text_sent == "Adding."
    assert ("tool_call", "math__add", "call_1") in live.sent
    # A Chat Completions stream sends its usage after the finish_reason, before [DONE].
    assert usage(answer)["output_tokens"] == 7


async def test_a_whole_text_answer_reaches_the_live_stream_at_once(
    provider: tuple[str, ModelProvider], fake: FakeModelApi
) -> None:
    name, made = provider
    text = "Five, as the server said in one piece."
    answer, live = await streamed(name, made, fake, Reply.text(text, streamed_as="json"))
    assert answer.text == text
    assert answer.stop_reason == StopReason.END_TURN
    assert live.sent == [("text", text)]


async def test_a_stream_cut_before_its_stop_reason_names_the_server_and_the_fix(
    provider: tuple[str, ModelProvider], fake: FakeModelApi
) -> None:
    name, made = provider
    with pytest.raises(ApplicationError) as caught:
        await streamed(name, made, fake, Reply.text("Five, and then", streamed_as="no_stop"))
    err = caught.value
    assert err.type == STREAM_INCOMPLETE
    assert err.non_retryable  # the server ends its streams so; the fix is the config's
    assert err.__cause__ is None
    stop = "stop_reason" if name == "anthropic" else "finish_reason"
    assert err.message.startswith(f"{name}: the streamed answer from 127.0.0.1:{fake.port} ")
    assert f"ended without a {stop}" in err.message
    assert f"`{name}: {{streaming: false}}`" in err.message
    assert KEY not in err.message and "/v1" not in err.message and "/azure" not in err.message


@pytest.mark.parametrize(
    ("step", "said"),
    [
        (Reply.raw(200, "", content_type="text/event-stream"), "ended before any answer"),
        (
            Reply.raw(200, "<html>gateway</html>", content_type="text/html"),
            "came as text/html, not as events",
        ),
    ],
    ids=["empty-stream", "html"],
)
async def test_a_stream_without_any_answer_says_what_came(
    provider: tuple[str, ModelProvider], fake: FakeModelApi, step: Step, said: str
) -> None:
    name, made = provider
    with pytest.raises(ApplicationError) as caught:
        await streamed(name, made, fake, step)
    assert caught.value.type == STREAM_INCOMPLETE
    assert said in caught.value.message
    assert "streaming: false" in caught.value.message


@pytest.mark.parametrize("body", ['{"not json', '["a", "list"]', '{"unexpected": true}'])
async def test_a_json_body_that_is_not_an_answer_is_unreadable(
    provider: tuple[str, ModelProvider], fake: FakeModelApi, body: str
) -> None:
    name, made = provider
    with pytest.raises(ApplicationError) as caught:
        await streamed(name, made, fake, Reply.raw(200, body))
    assert caught.value.type == "ProviderResponseInvalid"
    assert caught.value.non_retryable
    assert caught.value.message.startswith(f"{name}: unreadable response: ")


@pytest.mark.parametrize("name", STREAMING)
async def test_streaming_false_makes_every_call_whole(name: str, fake: FakeModelApi) -> None:
    made = make(name, fake, streaming=False)
    assert not made.streams  # so llm_step opens no live stream for it
    fake.script(Reply.text("Whole, as asked."))
    live = Recorder()
    try:
        with streaming_to(live):
            answer = await made.complete_model(llm_request(), ModelRef(name, "model-x"))
    finally:
        await made.aclose()
    assert answer.text == "Whole, as asked."
    assert "stream" not in fake.requests[0].body
    assert live.sent == []


def test_an_exception_without_text_is_never_an_empty_message() -> None:
    err = classify(AssertionError(), provider="generic")
    assert err.message == "generic: AssertionError: AssertionError()"
    assert err.type == "ProviderError"
    # Its text when it has one, as before.
    assert classify(KeyError("k"), provider="x").message == "x: KeyError: 'k'"
