"""OpenTelemetry traces (issue 24): real turns on the dev server through the real Anthropic SDK
and the fake API, spans collected by the OpenTelemetry SDK's in-memory exporter. The span
tree (turn, model calls, tool calls, one trace), the GenAI attributes, no content unless
``trace_content``, and one trace across a worker restart."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client

from tests.conftest import eventually, make_settings
from turnkeep import TurnHandle, TurnInput, build_worker, start_turn
from turnkeep.config.settings import ObservabilitySettings
from turnkeep.observability.setup import tracing_interceptors
from turnkeep.observability.tracing import TurnTracing, turn_ids
from turnkeep.testing.fake_api import FakeModelApi, Reply, Tokens

pytestmark = pytest.mark.asyncio

PROMPT = "What is 2 + 3? SECRET-PROMPT-7c1"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS: dict[str, list[Callable[..., Any]]] = {"math": [add]}


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def config(fake: FakeModelApi, **agent: Any) -> dict[str, Any]:
    return {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "agents": {
            "traced": {
                "model": "anthropic.test-model",
                "servers": ["math"],
                "llm_timeouts": {"start_to_close": 30, "heartbeat": 5, "max_attempts": 2},
                **agent,
            }
        },
    }


def script(fake: FakeModelApi) -> None:
    fake.script(
        Reply.tool_calls(("c1", "math__add", {"a": 2, "b": 3}), usage=Tokens(input=100, output=9)),
        Reply.text("It is 5.", usage=Tokens(input=130, output=4)),
        api="anthropic",
    )


async def start(client: Client, queue: str) -> TurnHandle:
    return await start_turn(client, TurnInput(agent="traced", messages=[PROMPT]), task_queue=queue)


def named(found: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in found if s.name.startswith(prefix)]


def ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[int]:
    """Span ids from ``span``'s parent up to the first parent not recorded here."""
    chain: list[int] = []
    parent = span.parent
    while parent is not None:
        chain.append(parent.span_id)
        above = by_id.get(parent.span_id)
        parent = above.parent if above is not None else None
    return chain


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def run_turn(
    client: Client,
    tmp_path: Path,
    fake: FakeModelApi,
    provider: TracerProvider,
    *,
    trace_content: bool,
) -> tuple[TurnHandle, Any]:
    settings = make_settings(tmp_path, **config(fake))
    queue = f"tracing-{uuid.uuid4().hex[:10]}"
    tracing = TurnTracing(provider, trace_content=trace_content)
    script(fake)
    worker = build_worker(
        client, settings, function_tools=TOOLS, task_queue=queue, interceptors=[tracing]
    )
    async with worker:
        turn = await start(client, queue)
        result = await turn.result()
    return turn, result


async def test_turn_model_and_tool_spans_form_one_trace_without_content(
    client: Client, fake: FakeModelApi, tmp_path: Path, spans: Any
) -> None:
    provider, exporter = spans
    turn, result = await run_turn(client, tmp_path, fake, provider, trace_content=False)
    assert result.final.text == "It is 5."
    found = list(exporter.get_finished_spans())
    description = await turn.handle.describe()
    trace_id, turn_span_id = turn_ids(description.run_id or "")

    [agent] = named(found, "invoke_agent")
    assert agent.name == "invoke_agent traced"
    assert (agent.context.trace_id, agent.context.span_id) == (trace_id, turn_span_id)
    assert agent.end_time is not None and agent.start_time is not None
    assert agent.end_time >= agent.start_time
    assert attributes(agent) | {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "traced",
        "gen_ai.usage.input_tokens": 230,
        "gen_ai.usage.output_tokens": 13,
        "gen_ai.response.finish_reasons": ("endTurn",),
    } == attributes(agent)

    chats = sorted(named(found, "chat "), key=lambda s: attributes(s)["turnkeep.call_index"])
    assert [c.name for c in chats] == ["chat test-model", "chat test-model"]
    first, second = (attributes(c) for c in chats)
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.provider.name"] == "anthropic"
    assert first["gen_ai.request.model"] == "test-model"
    assert first["gen_ai.agent.name"] == "traced"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (100, 9)
    assert first["gen_ai.response.finish_reasons"] == ("toolUse",)
    assert (second["gen_ai.usage.input_tokens"], second["gen_ai.usage.output_tokens"]) == (130, 4)
    assert second["gen_ai.response.finish_reasons"] == ("endTurn",)

    [tool] = named(found, "execute_tool")
    assert tool.name == "execute_tool math__add"
    assert attributes(tool) | {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "math__add",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.agent.name": "traced",
    } == attributes(tool)

    # One trace; model and tool calls sit under the turn span (through the SDK's spans).
    by_id = {s.context.span_id: s for s in found}
    for span in [*chats, tool]:
        assert span.context.trace_id == trace_id
        assert turn_span_id in ancestors(span, by_id), span.name
    assert {s.context.trace_id for s in found} == {trace_id}

    # No content by default: neither the prompt, the arguments nor the results.
    text = json.dumps([attributes(s) for s in found], default=str)
    assert "SECRET-PROMPT" not in text and "It is 5." not in text
    for key in ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments"):
        assert key not in text


async def test_trace_content_puts_messages_arguments_and_results_on_spans(
    client: Client, fake: FakeModelApi, tmp_path: Path, spans: Any
) -> None:
    provider, exporter = spans
    await run_turn(client, tmp_path, fake, provider, trace_content=True)
    found = list(exporter.get_finished_spans())
    chats = sorted(named(found, "chat "), key=lambda s: attributes(s)["turnkeep.call_index"])
    sent = json.loads(attributes(chats[0])["gen_ai.input.messages"])
    assert sent == [{"role": "user", "parts": [{"type": "text", "content": PROMPT}]}]
    answered = json.loads(attributes(chats[1])["gen_ai.output.messages"])
    assert answered == [{"role": "assistant", "parts": [{"type": "text", "content": "It is 5."}]}]
    [tool] = named(found, "execute_tool")
    assert json.loads(attributes(tool)["gen_ai.tool.call.arguments"]) == {"a": 2, "b": 3}
    assert attributes(tool)["gen_ai.tool.call.result"] == "5"


async def test_a_turn_resumed_on_another_worker_stays_in_its_trace(
    client: Client, fake: FakeModelApi, tmp_path: Path, spans: Any
) -> None:
    provider, exporter = spans
    settings = make_settings(
        tmp_path, **config(fake, approval={"tools": ["math__add"], "timeout": "1h"})
    )
    queue = f"tracing-{uuid.uuid4().hex[:10]}"
    script(fake)

    def worker() -> Any:
        # A new interceptor per worker, as a new process would have.
        tracing = TurnTracing(provider)
        return build_worker(
            client, settings, function_tools=TOOLS, task_queue=queue, interceptors=[tracing]
        )

    async with worker():
        turn = await start(client, queue)
        await eventually(turn.pending_approvals, "c1 awaits approval")
    before = list(exporter.get_finished_spans())
    assert len(named(before, "chat ")) == 1 and not named(before, "invoke_agent")
    exporter.clear()

    # Another worker replays to the wait; the rest of the turn runs there.
    async with worker():
        await turn.decide("c1", True, by="alice")
        result = await turn.result()
    assert result.final.text == "It is 5."
    after = list(exporter.get_finished_spans())
    description = await turn.handle.describe()
    trace_id, turn_span_id = turn_ids(description.run_id or "")

    # Nothing the first worker did is recorded again, and what the second did joins the trace.
    assert len(named(after, "chat ")) == 1 and len(named(after, "execute_tool")) == 1
    [agent] = named(after, "invoke_agent")
    assert (agent.context.trace_id, agent.context.span_id) == (trace_id, turn_span_id)
    by_id = {s.context.span_id: s for s in [*before, *after]}
    for span in [*named(before, "chat "), *named(after, "chat "), *named(after, "execute_tool")]:
        assert span.context.trace_id == trace_id
        assert turn_span_id in ancestors(span, by_id), span.name


async def test_a_turn_that_continues_as_new_is_one_turn_span_in_one_trace(
    client: Client, fake: FakeModelApi, tmp_path: Path, spans: Any
) -> None:
    provider, exporter = spans
    # Every step's end finds the run full: the turn runs in three runs.
    settings = make_settings(tmp_path, continue_as_new={"history_events": 1}, **config(fake))
    queue = f"tracing-{uuid.uuid4().hex[:10]}"
    script(fake)
    tracing = TurnTracing(provider)
    worker = build_worker(
        client, settings, function_tools=TOOLS, task_queue=queue, interceptors=[tracing]
    )
    async with worker:
        turn = await start(client, queue)
        result = await turn.result()
    assert result.final.text == "It is 5."
    first_run = turn.handle.first_execution_run_id or turn.handle.result_run_id or ""
    description = await turn.handle.describe()
    assert description.run_id != first_run  # it did continue as new
    trace_id, turn_span_id = turn_ids(first_run)
    found = list(exporter.get_finished_spans())
    [agent] = named(found, "invoke_agent")
    assert (agent.context.trace_id, agent.context.span_id) == (trace_id, turn_span_id)
    # The turn span starts when the first run did, before the first model call.
    [first_chat] = [s for s in named(found, "chat ") if attributes(s)["turnkeep.call_index"] == 1]
    assert agent.start_time is not None and first_chat.start_time is not None
    assert agent.start_time <= first_chat.start_time
    by_id = {s.context.span_id: s for s in found}
    calls = [*named(found, "chat "), *named(found, "execute_tool")]
    assert len(calls) == 3
    for span in calls:
        assert span.context.trace_id == trace_id
        assert turn_span_id in ancestors(span, by_id), span.name


async def test_workers_of_one_process_share_a_provider(
    client: Client, fake: FakeModelApi, tmp_path: Path, spans: Any
) -> None:
    """The SDK hands every caller the same tracer; each worker's turns still get their ids."""
    provider, exporter = spans
    for _ in range(2):
        exporter.clear()
        turn, _ = await run_turn(client, tmp_path, fake, provider, trace_content=False)
        [agent] = named(list(exporter.get_finished_spans()), "invoke_agent")
        first_run = turn.handle.first_execution_run_id or turn.handle.result_run_id or ""
        assert (agent.context.trace_id, agent.context.span_id) == turn_ids(first_run)


async def test_settings_switch_tracing_on() -> None:
    assert tracing_interceptors(ObservabilitySettings()) == []
    [interceptor] = tracing_interceptors(ObservabilitySettings(tracing=True, trace_content=True))
    assert isinstance(interceptor, TurnTracing) and interceptor.trace_content
