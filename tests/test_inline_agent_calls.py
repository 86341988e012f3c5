"""Agents called inline (an agent's ``call: inline``, an opt-in): a call of ``agent__<name>``
runs that agent's loop inside the calling turn's workflow, its model and tool calls activities
of the caller's, and no child workflow; on the real dev server, the passthrough model scripting
both sides as in ``test_agent_tools``."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from tests.conftest import Harness, HarnessFactory, eventually, make_settings
from tests.test_agent_tools_durability import SLOW_SECONDS, TURN_WITHIN, scheduled, team_workers
from tests.test_durability import TOOL, starts
from tests.test_limits import waits_for_capacity
from tests.test_live_stream import collect
from tests.worker_process import WorkerProcesses
from turnkeep.activities.tools import idempotency_key
from turnkeep.client.live import TextDelta
from turnkeep.client.turns import start_turn
from turnkeep.config.catalog import INLINE_MAX_ITERATIONS
from turnkeep.config.settings import AgentOptions
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import TurnCancelledError, TurnInput, Usage
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.fake_api import Answer, FakeModelApi, Reply
from turnkeep.worker.build import build_worker
from turnkeep.workflows.agent_tools import child_id
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio


async def quick(name: str) -> str:
    return f"{name} done"


def ask(*calls: tuple[str, str]) -> str:
    return "\n".join(
        f"***CALL_TOOL agent__{agent} {json.dumps({'message': message})}"
        for agent, message in calls
    )


TEAM: dict[str, Any] = {
    "pmo": {"model": "passthrough", "agents": ["ny", "london", "slow"]},
    "ny": {"model": "passthrough", "call": "inline"},
    "london": {"model": "passthrough", "servers": ["local"], "call": "inline"},
    # Its work waits behind normal work: inline too, its activities carry its priority.
    "slow": {"model": "passthrough", "call": "inline", "priority": "batch"},
    "chain": {"type": "chain", "sequence": ["london", "ny"]},
    # An evaluator's step asks for structured output, which only a child turn gives.
    "editor": {"type": "evaluator_optimizer", "generator": "ny", "evaluator": "slow"},
}


@pytest.fixture
async def h(client: Client, tmp_path: Path) -> AsyncIterator[Harness]:
    settings = make_settings(tmp_path, agents=TEAM)
    async with worker_harness(
        client, settings, function_tools={"local": [quick]}, default_agent="pmo"
    ) as worker:
        yield worker


async def _exists(client: Client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return False
    return True


async def test_an_inline_call_answers_with_the_agents_loop_and_its_usage(h: Harness) -> None:
    tool_call = '***CALL_TOOL local__quick {"name": "page"}'
    turn = await h.start(ask(("ny", "status of OpenAI"), ("london", tool_call)))
    result = await turn.result()

    assert result.stop_reason == StopReason.END_TURN
    request, results = result.messages[1], result.messages[2]
    # ny echoed its message; london's loop called its own tool, then echoed the result.
    assert [r.text for r in (results.tool_results or {}).values()] == [
        "status of OpenAI",
        "page done",
    ]
    # No child workflow: the agents' steps are the parent's own activities, named for them.
    for call_id in request.tool_calls or {}:
        assert not await _exists(h.client, child_id(turn.workflow_id, 1, call_id))
    summaries = await _activity_summaries(h, turn.workflow_id)
    assert "prepare agent ny" in summaries and "prepare agent london" in summaries
    assert any(s.startswith("ny · llm #1") for s in summaries)
    assert any(s.startswith("london · llm #2") for s in summaries)
    assert any(s.startswith("london · tool local__quick") for s in summaries)

    # Usage rolls up as for a child turn.
    assert set(result.usage_by_agent) == {"pmo", "ny", "london"}
    assert result.usage_by_agent["ny"]["passthrough"].calls == 1
    assert result.usage_by_agent["london"]["passthrough"].calls == 2
    total = sum(
        (u for by_model in result.usage_by_agent.values() for u in by_model.values()), Usage()
    )
    assert result.usage["passthrough"] == total


async def test_calls_of_one_agent_share_its_plan(h: Harness) -> None:
    turn = await h.start(ask(("ny", "one"), ("ny", "two")))
    result = await turn.result()
    assert [r.text for r in (result.messages[2].tool_results or {}).values()] == ["one", "two"]
    summaries = await _activity_summaries(h, turn.workflow_id)
    assert summaries.count("prepare agent ny") == 1
    assert result.usage_by_agent["ny"]["passthrough"].calls == 2


@pytest.mark.parametrize(
    ("options", "conflict"),
    [
        ({"type": "chain", "sequence": ["other"]}, "type chain"),
        ({"hooks": {"before_llm_call": ["audit"]}}, "hooks"),
        ({"approval": {"tools": ["*"]}}, "approval"),
        ({"client_tools": [{"name": "pick"}]}, "client_tools"),
        ({"agents": ["other"]}, "agents (agent tools)"),
        ({"budget": {"tokens": 1000}}, "budget"),
        ({"fallback_models": ["passthrough"]}, "fallback_models"),
        ({"servers": ["asks"]}, "servers that ask (elicitation forms or sampling): ['asks']"),
        (
            {"max_iterations": INLINE_MAX_ITERATIONS + 1},
            f"max_iterations {INLINE_MAX_ITERATIONS + 1}",
        ),
    ],
)
async def test_a_worker_refuses_an_inline_agent_with_what_only_a_child_runs(
    client: Client, tmp_path: Path, options: dict[str, Any], conflict: str
) -> None:
    settings = make_settings(
        tmp_path,
        mcp={"servers": {"asks": {"command": "none", "elicitation": {"mode": "forms"}}}},
        hooks={"audit": "tests.test_inline_agent_calls:quick"},
        agents={
            "boss": {"model": "passthrough", "agents": ["helper"]},
            "helper": {"model": "passthrough", "call": "inline", **options},
            "other": {"model": "passthrough"},
        },
    )
    with pytest.raises(ValueError) as raised:
        build_worker(client, settings, task_queue="never")
    assert f"agent 'helper' says `call: inline` but has {conflict}" in str(raised.value)


async def test_the_default_max_iterations_is_allowed_inline() -> None:
    assert AgentOptions().max_iterations <= INLINE_MAX_ITERATIONS


async def test_a_step_asked_for_structured_output_runs_as_a_child(h: Harness) -> None:
    turn = await h.start('{"rating": "EXCELLENT", "feedback": "fine"}', agent="editor")
    result = await turn.result()
    assert result.stop_reason == StopReason.END_TURN
    # The generator's steps ran inline, the evaluator's (structured output) as child turns.
    query = f"ParentWorkflowId = '{turn.workflow_id}'"
    children = [c.id async for c in h.client.list_workflows(query)]
    assert children and all(c.endswith("/slow") for c in children)


async def test_an_inline_agents_activities_carry_its_own_priority(h: Harness) -> None:
    turn = await h.start(ask(("slow", "later")))
    result = await turn.result()
    assert result.stop_reason == StopReason.END_TURN
    history = await h.client.get_workflow_handle(turn.workflow_id).fetch_history()
    keys = [
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            e.activity_task_scheduled_event_attributes.priority.priority_key,
        )
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    # The caller's own activities at Temporal's default (0: normal, unset); slow's at batch's.
    assert keys == [("prepare_turn", 0), ("llm_step", 0), ("llm_step", 5), ("llm_step", 0)]


async def test_a_chain_runs_its_inline_steps_in_its_own_workflow(h: Harness) -> None:
    turn = await h.start('***CALL_TOOL local__quick {"name": "page"}', agent="chain")
    result = await turn.result()
    assert result.final is not None and result.final.text == "page done"
    assert not await _exists(h.client, child_id(turn.workflow_id, 1, "london"))
    assert set(result.usage_by_agent) == {"chain", "london", "ny"}


async def _activity_summaries(h: Harness, workflow_id: str) -> list[str]:
    history = await h.client.get_workflow_handle(workflow_id).fetch_history()
    converter = h.client.data_converter.payload_converter
    out = []
    for event in history.events:
        summary = event.user_metadata.summary
        if summary.data:
            out.append(str(converter.from_payload(summary, str)))
    return out


# --- a worker killed mid-call -----------------------------------------------------------------


@pytest.fixture
async def workers(
    temporal: ServerInfo, tmp_path: Path
) -> AsyncIterator[tuple[WorkerProcesses, str, Path]]:
    with team_workers(temporal, tmp_path, call="inline") as processes:
        yield processes


@pytest.mark.slow  # worker processes of its own, one of them killed
async def test_a_worker_killed_while_an_inline_agents_tool_runs(
    client: Client, workers: tuple[WorkerProcesses, str, Path]
) -> None:
    processes, task_queue, record = workers
    first = processes.start()
    await processes.wait_polling(client, task_queue, first)
    slow = json.dumps({"tag": "slow", "seconds": SLOW_SECONDS})
    turn = await start_turn(
        client,
        TurnInput(agent="boss", messages=[ask(("helper", f"***CALL_TOOL {TOOL} {slow}"))]),
        task_queue=task_queue,
    )
    # The helper's tool is keyed as a child turn's would be, not as the parent's own call_1_1.
    scope = child_id(turn.workflow_id, 1, "call_1_1")
    await eventually(lambda: starts(record, scope, "call_1_1"), "the helper's tool is running")
    processes.kill(first)
    second = processes.start()
    await processes.wait_polling(client, task_queue, second)
    try:
        result = await asyncio.wait_for(turn.result(), TURN_WITHIN)
    except TimeoutError:
        raise AssertionError(f"the turn did not finish:\n{processes.log_tail()}") from None

    assert result.stop_reason == StopReason.END_TURN
    [tool_result] = (result.messages[2].tool_results or {}).values()
    assert not tool_result.is_error and tool_result.text == "slow done"
    assert result.usage_by_agent["helper"]["passthrough"].calls == 2
    # Resumed where it was: no model call made again, no child; the tool retried, same key.
    events = [e async for e in client.get_workflow_handle(turn.workflow_id).fetch_history_events()]
    assert scheduled(events) == [
        "prepare_turn",
        "llm_step",
        "local prepare_turn",
        "list_tools",
        "llm_step",
        "call_tool",
        "llm_step",
        "llm_step",
    ]
    runs = starts(record, scope, "call_1_1")
    assert [r["worker"] for r in runs] == [first, second]
    assert {r["key"] for r in runs} == {idempotency_key(scope, "call_1_1")}
    assert not await _exists(client, scope)


async def test_inline_calls_read_their_input_by_query_each_its_own(
    client: Client, tmp_path: Path
) -> None:
    """Without the in-memory hand-off, ``llm_step`` reads each request by query: two calls of
    one agent in one batch are both its model call #1, told apart by the agent call."""
    settings = make_settings(tmp_path, agents=TEAM)
    queue = f"inline-query-{uuid.uuid4().hex[:8]}"
    worker = build_worker(
        client,
        settings,
        function_tools={"local": [quick]},
        task_queue=queue,
        model_input_handoff=False,
    )
    async with worker:
        turn = TurnInput(agent="pmo", messages=[ask(("ny", "one"), ("ny", "two"))])
        result = await (await start_turn(client, turn, task_queue=queue)).result()
    assert [r.text for r in (result.messages[2].tool_results or {}).values()] == ["one", "two"]


async def test_an_inline_agents_model_calls_are_not_streamed_as_the_callers_text(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    """Live text follows the turn's model calls: an inline agent's would read as the caller's
    own, so they are made whole, and its answer arrives as the tool result."""
    message = json.dumps({"message": "hello"})
    # The caller's first answer holds its last chunk until the follower has seen a delta, so
    # the follower is on the live stream while the helper's call is made.
    held = threading.Event()
    fake.script(
        Answer(
            text="Asking the helper now.",
            calls=(("call_1", "agent__helper", message),),
            hold=held,
        ),
        Reply.text("Thanks."),
        model="boss-model",
    )
    fake.script(Reply.text("The helper's words."), model="helper-model")
    config = {
        "openai": {"api_key": "sk-turnkeep-inline", "base_url": fake.base_url_openai},
        "streaming": {"listen": "127.0.0.1:0"},
        "agents": {
            "test": {"model": "openai.boss-model", "agents": ["helper"]},
            "helper": {"model": "openai.helper-model", "call": "inline"},
        },
    }
    try:
        async with harness(**config) as h:
            handle = await h.start("hi")
            events = await collect(handle, held)
            result = await handle.result()
    finally:
        held.set()

    assert result.final is not None and result.final.text == "Thanks."
    assert (result.messages[2].tool_results or {})["call_1"].text == "The helper's words."
    live_text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert live_text == "Asking the helper now."
    assert [r.body.get("stream") is True for r in fake.requests_for_model("boss-model")] == [
        True,
        True,
    ]
    assert [r.body.get("stream") is True for r in fake.requests_for_model("helper-model")] == [
        False
    ]


async def test_an_inline_agents_model_calls_wait_for_their_limit(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    """A model with a limit holds an inline agent's calls as it holds any turn's: the caller
    says why it waits."""
    model = f"m{uuid.uuid4().hex[:10]}"
    fake.script(Reply.delay(3.0, Reply.text("first")), Reply.text("second"), model=model)
    config = {
        "anthropic": {"api_key": "sk-turnkeep-inline", "base_url": fake.base_url_anthropic},
        "limits": {f"anthropic.{model}": {"concurrency": 1}},
        "agents": {
            "test": {"model": f"anthropic.{model}", "call": "inline"},
            "boss": {"model": "passthrough", "agents": ["test"]},
        },
    }
    async with harness(**config) as h:
        first = await h.start("one")
        await eventually(lambda: fake.requests_for_model(model), "the first call is in flight")
        boss = await h.start(ask(("test", "two")), agent="boss")
        await eventually(lambda: waits_for_capacity(boss), "the inline call waits for capacity")
        result = await boss.result()
        assert (await first.result()).final.text == "first"  # type: ignore[union-attr]
    assert result.final is not None and result.final.text == "second"
    assert len(fake.requests_for_model(model)) == 2


# --- the caller cancelled mid-call ------------------------------------------------------------

_blocked_started: list[str] = []


async def blocked(name: str) -> str:
    """Blocks until cancelled: the turn is cancelled while it runs."""
    _blocked_started.append(name)
    await asyncio.Event().wait()
    return name


async def test_cancelling_the_caller_cancels_its_inline_call_and_repairs_it(
    client: Client, tmp_path: Path
) -> None:
    """The inline agent's running tool is an activity of the caller: cancelling the caller
    cancels it, and the caller's repair answers the agent call as interrupted."""
    agents = {
        "boss": {"model": "passthrough", "agents": ["worker"]},
        "worker": {"model": "passthrough", "servers": ["local"], "call": "inline"},
    }
    name = uuid.uuid4().hex[:8]
    settings = make_settings(tmp_path, agents=agents)
    async with worker_harness(
        client, settings, function_tools={"local": [blocked]}, default_agent="boss"
    ) as h:
        call = "***CALL_TOOL local__blocked " + json.dumps({"name": name})
        turn = await h.start(ask(("worker", call)))
        await eventually(lambda: name in _blocked_started, "the inline agent's tool started")
        await turn.cancel()
        with pytest.raises(TurnCancelledError) as raised:
            await turn.result()
    caller = raised.value.result
    assert caller is not None and caller.stop_reason == StopReason.CANCELLED
    [(call_id, repaired)] = list((caller.messages[-1].tool_results or {}).items())
    assert repaired.is_error and repaired.text == INTERRUPTED_TEXT
    assert not await _exists(client, child_id(turn.workflow_id, 1, call_id))
    # The tool's activity, the caller's own, was cancelled, not left running.
    events = [e async for e in client.get_workflow_handle(turn.workflow_id).fetch_history_events()]
    assert any(e.HasField("activity_task_cancel_requested_event_attributes") for e in events)
