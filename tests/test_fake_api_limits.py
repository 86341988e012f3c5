"""The fake API's provider limits: requests and tokens per minute over a sliding window, 429s
shaped as each provider's, through the real SDKs; and the counts a bench reads."""

from __future__ import annotations

import asyncio
import json

import anthropic
import openai
import pytest

from turnkeep.testing.fake_api import (
    FakeModelApi,
    ProviderLimits,
    Reply,
    Tokens,
    read_stats,
    request_tokens,
)
from turnkeep.testing.fake_api.limits import LimitWindow

KEY = "sk-test"


def openai_client(fake: FakeModelApi) -> openai.AsyncOpenAI:
    # No retries of the SDK's own: the 429 is what is asserted.
    return openai.AsyncOpenAI(api_key=KEY, base_url=fake.base_url_openai, max_retries=0)


def anthropic_client(fake: FakeModelApi) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url_anthropic, max_retries=0)


async def ask_openai(fake: FakeModelApi, text: str = "hi") -> str | None:
    answer = await openai_client(fake).chat.completions.create(
        model="gpt-4.1", messages=[{"role": "user", "content": text}]
    )
    return answer.choices[0].message.content


async def test_openai_gets_a_429_with_retry_after_beyond_the_requests_per_minute() -> None:
    with FakeModelApi(
        default=Reply.text("ok"), limits=ProviderLimits(requests_per_minute=2)
    ) as fake:
        assert [await ask_openai(fake), await ask_openai(fake)] == ["ok", "ok"]
        with pytest.raises(openai.RateLimitError) as raised:
            await ask_openai(fake)
        err = raised.value
        assert err.status_code == 429
        headers = err.response.headers
        # The first request leaves the window a minute after it came, less the time since.
        assert 58 <= int(headers["retry-after-ms"]) / 1000 <= 60
        assert headers["retry-after"] == "60"
        assert isinstance(err.body, dict)
        assert err.body["code"] == "rate_limit_exceeded"
        assert err.body["type"] == "requests"
        assert "on requests per min (RPM): Limit 2, Used 2, Requested 1" in err.body["message"]
        stats = fake.limit_stats()
        assert (stats.answered, stats.rate_limited, stats.peak_requests) == (2, 1, 2)
        assert stats.rate_limited_share == pytest.approx(1 / 3)


async def test_anthropic_gets_its_rate_limit_error_with_retry_after() -> None:
    with FakeModelApi(
        default=Reply.text("ok"), limits=ProviderLimits(requests_per_minute=1)
    ) as fake:
        client = anthropic_client(fake)
        await client.messages.create(
            model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        with pytest.raises(anthropic.RateLimitError) as raised:
            await client.messages.create(
                model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
        err = raised.value
        assert err.response.headers["retry-after"] == "60"
        assert "retry-after-ms" not in err.response.headers  # OpenAI's, not Anthropic's
        assert err.body == {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "message": "This request would exceed the rate limit for your organization of "
                "1 requests per minute. For details, refer to: "
                "https://docs.anthropic.com/en/api/rate-limits.",
            },
        }


async def test_tokens_per_minute_count_the_usage_answers_report() -> None:
    # 15 tokens an answer (10 prompt + 5 completion, the default usage): two fit in 40.
    with FakeModelApi(limits=ProviderLimits(tokens_per_minute=40)) as fake:
        fake.script(Reply.text("one"), Reply.text("two"), Reply.text("three"))
        assert [await ask_openai(fake), await ask_openai(fake)] == ["one", "two"]
        with pytest.raises(openai.RateLimitError) as raised:
            await ask_openai(fake)
        assert isinstance(raised.value.body, dict)
        assert raised.value.body["type"] == "tokens"
        assert "Limit 40, Used 30, Requested 15" in raised.value.body["message"]
        # The refused request used up no step: the script's next answer is still there.
        assert fake.pending("openai") == 1
        stats = fake.limit_stats()
        assert (stats.tokens, stats.peak_tokens) == (30, 30)


async def test_the_window_slides() -> None:
    limits = ProviderLimits(requests_per_minute=2, window=1.0)
    with FakeModelApi(default=Reply.text("ok"), limits=limits) as fake:
        await ask_openai(fake)
        await ask_openai(fake)
        with pytest.raises(openai.RateLimitError) as raised:
            await ask_openai(fake)
        # Room again once the first request has left the window: less than a window from now.
        wait = int(raised.value.response.headers["retry-after-ms"]) / 1000
        assert 0 < wait <= 1.0
        await asyncio.sleep(wait + 0.05)
        assert await ask_openai(fake) == "ok"
        stats = fake.limit_stats()
        assert (stats.answered, stats.rate_limited, stats.peak_requests) == (3, 1, 2)


async def test_the_counts_read_over_http_and_start_afresh() -> None:
    with FakeModelApi(default=Reply.text("ok")) as fake:
        await ask_openai(fake)
        over_http = read_stats(fake.base_url_openai)
        assert over_http == fake.limit_stats()
        assert (over_http.answered, over_http.tokens, over_http.window) == (1, 15, 60.0)
        fake.limit(ProviderLimits(requests_per_minute=1))
        assert read_stats(fake.base_url_anthropic).answered == 0
        await ask_openai(fake)
        fake.reset()
        assert fake.limit_stats().answered == 0
        assert fake.limits == ProviderLimits(requests_per_minute=1)  # limits stay


async def test_sized_usage_follows_from_the_request() -> None:
    with FakeModelApi(default=Reply.text("ok", usage=Tokens(output=50, sized=True))) as fake:
        client = openai_client(fake)
        answers = [
            await client.chat.completions.create(
                model="gpt-4.1", messages=[{"role": "user", "content": "x" * chars}]
            )
            for chars in (0, 400, 400)
        ]
        prompts = [a.usage.prompt_tokens for a in answers if a.usage is not None]
        assert prompts[1] == prompts[2] == prompts[0] + 100  # 4 characters a token
        assert prompts[0] == request_tokens(fake.requests[0].body)
        assert [a.usage.completion_tokens for a in answers if a.usage is not None] == [50] * 3
        assert fake.limit_stats().tokens == sum(prompts) + 150


def test_the_window_without_a_server() -> None:
    window = LimitWindow(ProviderLimits(requests_per_minute=3, tokens_per_minute=100))
    assert window.admit(40, now=0.0) is None
    assert window.admit(40, now=10.0) is None
    refusal = window.admit(40, now=20.0)  # 120 > 100: room once the first has left
    assert refusal is not None
    assert (refusal.kind, refusal.used, refusal.requested) == ("tokens", 80, 40)
    assert refusal.retry_after == pytest.approx(40.0)
    assert window.admit(20, now=20.0) is None
    refusal = window.admit(1, now=30.0)  # a fourth request: the first must leave first
    assert refusal is not None and refusal.kind == "requests"
    assert refusal.retry_after == pytest.approx(30.0)
    assert window.admit(200, now=61.0) is not None  # more than the limit alone: never fits
    assert window.admit(40, now=61.0) is None
    stats = window.stats()
    assert (stats.answered, stats.rate_limited, stats.tokens) == (4, 3, 140)
    assert (stats.peak_requests, stats.peak_tokens) == (3, 100)
    assert json.loads(json.dumps(stats.to_json()))["peak_tokens"] == 100


def test_limits_are_positive() -> None:
    with pytest.raises(ValueError, match="requests_per_minute must be > 0"):
        ProviderLimits(requests_per_minute=0)
    with pytest.raises(ValueError, match="window must be > 0"):
        ProviderLimits(window=0)
