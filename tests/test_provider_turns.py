"""Whole turns on real providers' SDKs: TurnWorkflow on the dev server, `llm_step` through the
official anthropic/openai clients, talking HTTP to the scriptable fake API on loopback."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import HarnessFactory, history_text
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import TurnResult, Usage
from turnkeep.testing.fake_api import FakeModelApi, Reply, Tokens

pytestmark = pytest.mark.asyncio

KEY = "sk-turnkeep-SECRET-4d1e2f9a"
APIS = ("anthropic", "openai")


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def config(api: str, fake: FakeModelApi, **llm_timeouts: Any) -> dict[str, Any]:
    base_url = fake.base_url_anthropic if api == "anthropic" else fake.base_url_openai
    timeouts = {"start_to_close": 30, "heartbeat": 5, "max_attempts": 3, **llm_timeouts}
    return {
        api: {"api_key": KEY, "base_url": base_url},
        "agents": {
            "test": {
                "model": f"{api}.test-model",
                "instruction": "Be brief.",
                "servers": ["math"],
                "llm_timeouts": timeouts,
            }
        },
    }


MATH = {"math": [add, mul]}


def results(result: TurnResult) -> dict[str, str]:
    return {cid: res.text for m in result.messages for cid, res in (m.tool_results or {}).items()}


@pytest.mark.parametrize("api", APIS)
async def test_multi_iteration_tool_loop_with_parallel_calls(
    api: str, fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Reply.tool_calls(
            ("call_a", "math__add", {"a": 2, "b": 3}),
            ("call_b", "math__mul", {"a": 4, "b": 5}),
            usage=Tokens(input=100, output=10),
        ),
        Reply.tool_calls(("call_c", "math__add", {"a": 5, "b": 20}), usage=Tokens(120, 8)),
        Reply.text("The answer is 25.", usage=Tokens(input=150, output=6)),
        api=api,  # type: ignore[arg-type]
    )
    async with harness(MATH, **config(api, fake)) as h:
        handle = await h.start("Compute (2+3) and (4*5), then add 20 to the first.")
        result = await handle.result()
        history = await handle.handle.fetch_history()

    assert results(result) == {"call_a": "5", "call_b": "20", "call_c": "25"}
    assert result.final is not None and result.final.text == "The answer is 25."
    assert result.iterations == 2
    assert result.usage == {f"{api}.test-model": Usage(input_tokens=370, output_tokens=24, calls=3)}
    # The third request carried the whole exchange back, tool results keyed by call id.
    sent = fake.requests_for(api)  # type: ignore[arg-type]
    assert len(sent) == 3
    body = str(sent[2].body)
    assert "call_a" in body and "call_b" in body and "call_c" in body and "25" in body
    # Secrets live in worker config only: never in any workflow or activity payload.
    text = history_text(history)
    assert "call_c" in text  # the decoded payloads are really there
    assert KEY not in text


@pytest.mark.parametrize("api", APIS)
async def test_rate_limit_waits_as_told_then_succeeds(
    api: str, fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Reply.error(429, "slow down", headers={"retry-after": "2"}),
        Reply.text("finally"),
        api=api,  # type: ignore[arg-type]
    )
    async with harness(MATH, **config(api, fake)) as h:
        result = await h.run("hi")
    assert result.final is not None and result.final.text == "finally"
    first, second = fake.requests_for(api)  # type: ignore[arg-type]
    # Temporal's retry took the provider's retry-after (2 s), not its own 1 s first backoff.
    assert second.at - first.at >= 2.0


@pytest.mark.parametrize("api", APIS)
async def test_server_error_is_retried(
    api: str, fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(Reply.error(500, "internal"), Reply.text("recovered"), api=api)  # type: ignore[arg-type]
    async with harness(MATH, **config(api, fake)) as h:
        result = await h.run("hi")
    assert result.final is not None and result.final.text == "recovered"
    assert len(fake.requests_for(api)) == 2  # type: ignore[arg-type]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (400, "messages: roles must alternate", "ProviderBadRequest"),
        (401, "invalid x-api-key", "ProviderAuthentication"),
    ],
)
async def test_client_errors_end_the_turn_with_an_error_message(
    api: str, status: int, message: str, kind: str, fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(Reply.error(status, message), api=api)  # type: ignore[arg-type]
    async with harness(MATH, **config(api, fake)) as h:
        result = await h.run("hi")
    assert result.stop_reason == StopReason.ERROR
    final = result.final
    assert final is not None and final.stop_reason == StopReason.ERROR
    error = (final.channels or {})["error"][0].text  # type: ignore[union-attr]
    assert kind in error and message in error and str(status) in error
    assert KEY not in error
    assert len(fake.requests_for(api)) == 1  # type: ignore[arg-type]  # not retried


@pytest.mark.parametrize("api", APIS)
async def test_a_provider_that_never_answers_is_cut_off_and_retried(
    api: str, fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Reply.delay(120, then=Reply.text("too late")),
        Reply.text("second attempt"),
        api=api,  # type: ignore[arg-type]
    )
    async with harness(MATH, **config(api, fake, start_to_close=4, heartbeat=2)) as h:
        result = await h.run("hi")
    assert result.final is not None and result.final.text == "second attempt"
    first, second = fake.requests_for(api)  # type: ignore[arg-type]
    assert second.at - first.at < 60  # cut off by the timeout, not by the 120 s answer
