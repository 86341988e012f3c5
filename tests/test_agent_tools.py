"""Agents as tools (``agents:`` of an agent, fast-agent's ``AgentsAsToolsAgent``): each listed
agent is a tool ``agent__<name>`` of the parent's model, and a call runs that agent's turn as a
child workflow on the agent's own task queue, on the real dev server. The passthrough model
scripts both sides: the parent's prompt names the calls, the child echoes its message (or
calls a tool of its own when the message says so)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from tests.conftest import Harness, eventually, make_settings
from turnkeep.client.history import ActivityOutcome, read_turn
from turnkeep.client.turns import get_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.activity_io import TurnPlan
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import TurnCancelledError, TurnResult, Usage
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.testing.fake_model import FakeModel
from turnkeep.worker.build import build_worker
from turnkeep.workflows.agent_tools import BUDGET_EXHAUSTED, child_id
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio

gate = asyncio.Event()
started: list[str] = []


async def blocked(name: str) -> str:
    """Blocks until the test opens the gate (it never does: the turn is cancelled)."""
    started.append(name)
    await gate.wait()
    return f"{name} passed"


def ask(*calls: tuple[str, str]) -> str:
    """A parent prompt that makes the passthrough model call these agents with these
    messages, all in one answer."""
    return "\n".join(
        f"***CALL_TOOL agent__{agent} {json.dumps({'message': message})}"
        for agent, message in calls
    )


TEAM: dict[str, Any] = {
    "pmo": {
        "model": "passthrough",
        "agents": ["ny", "london"],
        "instruction": "Get reports from the project managers.",
    },
    "ny": {"model": "passthrough", "description": "New York's project manager."},
    "london": {"model": "passthrough", "servers": ["local"]},
}


@pytest.fixture
async def h(client: Client, tmp_path: Path) -> AsyncIterator[Harness]:
    started.clear()
    settings = make_settings(tmp_path, agents=TEAM)
    async with worker_harness(
        client, settings, function_tools={"local": [blocked]}, default_agent="pmo"
    ) as worker:
        yield worker


async def test_a_parent_calls_agents_as_tools_each_a_child_turn(h: Harness) -> None:
    turn = await h.start(ask(("ny", "status of OpenAI"), ("london", "news on Art")))
    result = await turn.result()

    assert result.stop_reason == StopReason.END_TURN
    request, results = result.messages[1], result.messages[2]
    assert [c.name for c in (request.tool_calls or {}).values()] == [
        "agent__ny",
        "agent__london",
    ]
    # Each child echoed its message; the parent's model answered with the results.
    assert [r.text for r in (results.tool_results or {}).values()] == [
        "status of OpenAI",
        "news on Art",
    ]
    assert result.final is not None and result.final.text == "status of OpenAI\nnews on Art"

    # Each call ran as a turn of its own: a child workflow of the parent, on its agent's queue.
    for call_id, agent in zip(request.tool_calls or {}, ["ny", "london"], strict=True):
        child = h.client.get_workflow_handle(child_id(turn.workflow_id, 1, call_id))
        described = await child.describe()
        assert described.status == WorkflowExecutionStatus.COMPLETED
        assert described.parent_id == turn.workflow_id
        assert described.task_queue == f"{h.task_queue}.{agent}"
        child_result = await get_turn(h.client, child.id).result()
        assert child_result.messages[0].text == results.tool_results[call_id].text  # type: ignore[index]

    # Usage rolls up: the parent's total is its own and its children's, and says whose is whose.
    assert set(result.usage_by_agent) == {"pmo", "ny", "london"}
    total = sum(
        (u for by_model in result.usage_by_agent.values() for u in by_model.values()), Usage()
    )
    assert result.usage["passthrough"] == total
    assert result.usage_by_agent["ny"]["passthrough"].calls == 1
    assert result.usage_by_agent["pmo"]["passthrough"].calls == 2


async def test_the_model_sees_agent_tools_beside_its_other_tools(h: Harness) -> None:
    """``agent__<name>``, described by the agent's description (else its instruction),
    taking fast-agent's ``{"message": str}``."""
    turn = await h.start("hello")
    await turn.result()
    plan_tools = await _offered_tools(h, turn.workflow_id)
    assert [t["name"] for t in plan_tools] == ["agent__ny", "agent__london"]
    ny = plan_tools[0]
    assert ny["description"] == "New York's project manager."
    assert ny["input_schema"]["required"] == ["message"]
    assert plan_tools[1]["description"] is None  # london has neither


async def _offered_tools(h: Harness, workflow_id: str) -> list[dict[str, Any]]:
    """The tools of the turn's plan, as recorded in its prepare_turn result (read back as the
    workflow reads it: a payload leaves out what holds its default)."""
    history = await h.client.get_workflow_handle(workflow_id).fetch_history()
    for event in history.events:
        if event.HasField("activity_task_completed_event_attributes"):
            payload = event.activity_task_completed_event_attributes.result.payloads[0]
            plan = TurnPlan.model_validate_json(payload.data)
            return [tool.spec.model_dump() for tool in plan.agent_tools]
    raise AssertionError("no prepare_turn result")


async def test_show_lists_a_called_agents_local_prepare_turn(h: Harness) -> None:
    """A called agent's prepare_turn runs as a local activity (a marker in its history, no
    activity events): `show` lists it all the same, completed, timed and marked local; the
    parent's activities, ordinary ones, keep the JSON they always had."""
    turn = await h.start(ask(("ny", "status")))
    result = await turn.result()
    [call_id] = result.messages[1].tool_calls or {}
    child = await read_turn(h.client, child_id(turn.workflow_id, 1, call_id))

    [setup] = [a for a in child.activities if a.activity == "prepare_turn"]
    assert setup.local and setup.outcome == ActivityOutcome.COMPLETED
    assert setup.attempts == 1 and setup.failure is None
    assert setup.closed_at is not None and setup.total_ms is not None and setup.total_ms >= 0
    assert setup.label == "prepare_turn (local)"
    assert child.activities.index(setup) == 0  # before the child's model call
    dumped = json.loads(child.model_dump_json())["activities"][0]
    assert dumped["local"] is True and dumped["outcome"] == "completed"

    parent = json.loads((await read_turn(h.client, turn.workflow_id)).model_dump_json())
    assert parent["activities"][0]["activity"] == "prepare_turn"
    assert all("local" not in a for a in parent["activities"])


async def test_a_child_that_stops_without_an_answer_is_an_error_result(
    client: Client, tmp_path: Path
) -> None:
    """fast-agent's rule: a child that stopped still asking for tools, having said nothing,
    answers with an isError result saying its budget ran out."""
    agents = {
        "boss": {"model": "passthrough", "agents": ["worker"]},
        "worker": {"model": "passthrough", "servers": ["local"], "max_iterations": 0},
    }
    settings = make_settings(tmp_path, agents=agents)
    async with worker_harness(
        client, settings, function_tools={"local": [quick]}, default_agent="boss"
    ) as h:
        call = '***CALL_TOOL local__quick {"name": "x"}'
        result = await h.run(ask(("worker", call)))
    tool_result = next(iter((result.messages[2].tool_results or {}).values()))
    assert tool_result.is_error
    assert tool_result.text == BUDGET_EXHAUSTED
    assert result.stop_reason == StopReason.END_TURN


def quick(name: str) -> str:
    return f"{name} done"


async def test_a_call_past_the_depth_limit_is_an_error_result_naming_the_limit(
    client: Client, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, agents=TEAM, max_agent_depth=0)
    async with worker_harness(
        client, settings, function_tools={"local": [blocked]}, default_agent="pmo"
    ) as h:
        result = await h.run(ask(("ny", "hi")))
    tool_result = next(iter((result.messages[2].tool_results or {}).values()))
    assert tool_result.is_error
    assert "AgentDepthExceeded" in tool_result.text
    assert "max_agent_depth (0)" in tool_result.text


async def test_max_parallel_bounds_the_child_turns_running_at_once(
    client: Client, tmp_path: Path
) -> None:
    agents = {
        "boss": {"model": "passthrough", "agents": ["sleeper"], "max_parallel": 1},
        "sleeper": {"model": "passthrough", "servers": ["local"]},
    }
    running: list[int] = []
    peak: list[int] = [0]

    async def nap(name: str) -> str:
        running.append(1)
        peak[0] = max(peak[0], len(running))
        await asyncio.sleep(0.2)
        running.pop()
        return name

    settings = make_settings(tmp_path, agents=agents)
    async with worker_harness(
        client, settings, function_tools={"local": [nap]}, default_agent="boss"
    ) as h:
        calls = [("sleeper", f'***CALL_TOOL local__nap {{"name": "n{i}"}}') for i in range(3)]
        result = await h.run(ask(*calls))
    texts = [r.text for r in (result.messages[2].tool_results or {}).values()]
    assert texts == ["n0", "n1", "n2"]
    assert peak[0] == 1


async def test_cancelling_the_parent_cancels_and_repairs_its_running_children(
    h: Harness,
) -> None:
    call = '***CALL_TOOL local__blocked {"name": "report"}'
    turn = await h.start(ask(("london", call)))
    await eventually(lambda: started == ["report"], "the child's tool started")
    await turn.cancel()
    with pytest.raises(TurnCancelledError) as raised:
        await turn.result()
    parent = raised.value.result
    assert parent is not None and parent.stop_reason == StopReason.CANCELLED
    # The parent's repair answers the agent call as interrupted...
    [(call_id, repaired)] = list((parent.messages[-1].tool_results or {}).items())
    assert repaired.is_error and repaired.text == INTERRUPTED_TEXT
    # ...and the child, cancelled with it, repaired its own call before the parent went on.
    child = get_turn(h.client, child_id(turn.workflow_id, 1, call_id))
    described = await h.client.get_workflow_handle(child.workflow_id).describe()
    assert described.status == WorkflowExecutionStatus.CANCELED
    with pytest.raises(TurnCancelledError) as child_raised:
        await child.result()
    child_result = child_raised.value.result
    assert child_result is not None
    last = child_result.messages[-1]
    assert [r.text for r in (last.tool_results or {}).values()] == [INTERRUPTED_TEXT]


async def test_a_child_cancelled_on_its_own_is_an_error_result_and_the_parent_goes_on(
    h: Harness,
) -> None:
    """An operator cancels the child from the Web UI: the parent's model hears about it."""
    call = '***CALL_TOOL local__blocked {"name": "report"}'
    turn = await h.start(ask(("london", call)))
    await eventually(lambda: started == ["report"], "the child's tool started")
    call_id = "call_1_1"
    await h.client.get_workflow_handle(child_id(turn.workflow_id, 1, call_id)).cancel()
    result: TurnResult = await turn.result()
    assert result.stop_reason == StopReason.END_TURN
    tool_result = (result.messages[2].tool_results or {})[call_id]
    assert tool_result.is_error
    assert tool_result.text == "Error: the turn of agent 'london' was cancelled"


@pytest.mark.parametrize(
    ("agents", "problem"),
    [
        (
            {"a": {"model": "passthrough", "agents": ["ghost"]}},
            "agent 'a' calls agent(s) ['ghost'], which are not in this worker's agents",
        ),
        (
            {
                "a": {"model": "passthrough", "agents": ["b"]},
                "b": {"model": "passthrough", "agents": ["a"]},
            },
            "agents call each other in a circle: a -> b -> a",
        ),
        (
            {"a": {"model": "passthrough", "agents": ["a"]}},
            "agents call each other in a circle: a -> a",
        ),
    ],
)
async def test_a_worker_refuses_a_team_with_a_missing_agent_or_a_circle(
    client: Client, agents: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError) as raised:
        build_worker(client, Settings.model_validate({"agents": agents}), task_queue="never")
    assert problem in str(raised.value)


# fast-agent's workflow agents: `chain` and `parallel`, each step a child turn.

WORKFLOWS: dict[str, Any] = {
    "fetcher": {"model": "passthrough", "servers": ["local"]},
    "writer": {"model": "passthrough"},
    "post_writer": {"type": "chain", "sequence": ["fetcher", "writer"]},
    "reviewer": {"type": "chain", "sequence": ["writer", "writer"], "cumulative": True},
    "grading": {"type": "parallel", "fan_out": ["writer", "fetcher"], "fan_in": "writer"},
    "checks": {"type": "parallel", "fan_out": ["writer"], "include_request": False},
    "route": {"type": "router", "model": "passthrough", "agents": ["writer", "fetcher"]},
    "only": {"type": "router", "model": "passthrough", "agents": ["writer"]},
    "editor": {
        "type": "evaluator_optimizer",
        "generator": "writer",
        "evaluator": "fetcher",
        "max_refinements": 2,
    },
}


@pytest.fixture
async def w(client: Client, tmp_path: Path) -> AsyncIterator[Harness]:
    started.clear()
    settings = make_settings(tmp_path, agents=WORKFLOWS)
    async with worker_harness(
        client, settings, function_tools={"local": [quick, blocked]}
    ) as worker:
        yield worker


async def test_a_chain_passes_each_answer_to_the_next_agent(w: Harness) -> None:
    turn = await w.start('***CALL_TOOL local__quick {"name": "page"}', agent="post_writer")
    result = await turn.result()
    # The fetcher called its tool and answered with the result; the writer echoed that.
    assert [m.role for m in result.messages] == ["user", "assistant"]
    assert result.final is not None and result.final.text == "page done"
    assert result.stop_reason == StopReason.END_TURN
    first = await get_turn(w.client, child_id(turn.workflow_id, 1, "fetcher")).result()
    second = await get_turn(w.client, child_id(turn.workflow_id, 2, "writer")).result()
    assert first.final is not None and first.final.text == "page done"
    assert second.messages[0].text == "page done"
    assert set(result.usage_by_agent) == {"post_writer", "fetcher", "writer"}
    assert result.usage_by_agent["fetcher"]["passthrough"].calls == 2


async def test_a_cumulative_chain_answers_with_every_step_tagged(w: Harness) -> None:
    result = await w.run("draft", agent="reviewer")
    assert result.final is not None
    assert result.final.text == (
        "<fastagent:request>draft</fastagent:request>\n\n"
        "<fastagent:response agent='writer'>draft</fastagent:response>\n\n"
        # The second writer saw the request and the first answer (both user messages).
        "<fastagent:response agent='writer'>draft\ndraft</fastagent:response>"
    )


async def test_a_parallel_fans_out_and_its_fan_in_aggregates(w: Harness) -> None:
    turn = await w.start("story", agent="grading")
    result = await turn.result()
    expected = (
        "The following request was sent to the agents:\n\n"
        "<fastagent:request>\nstory\n</fastagent:request>\n\n"
        '<fastagent:response agent="writer">\nstory\n</fastagent:response>\n\n'
        '<fastagent:response agent="fetcher">\nstory\n</fastagent:response>'
    )
    # The fan-in agent (a passthrough writer) echoed the aggregated answers.
    assert result.final is not None and result.final.text == expected
    fan_in = await get_turn(w.client, child_id(turn.workflow_id, 2, "writer")).result()
    assert fan_in.messages[0].text == expected
    without = await w.run("story", agent="checks")
    assert without.final is not None
    assert without.final.text == '<fastagent:response agent="writer">\nstory\n</fastagent:response>'


async def test_a_failing_step_ends_the_chain_with_an_error_naming_it(
    client: Client, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, agents=WORKFLOWS, max_agent_depth=0)
    async with worker_harness(client, settings, function_tools={"local": [quick]}) as h:
        result = await h.run("x", agent="post_writer")
    assert result.stop_reason == StopReason.ERROR
    assert result.final is not None
    assert result.final.text.startswith("step 1 of the chain (fetcher) failed: Error: ")
    assert "AgentDepthExceeded" in result.final.text


async def test_cancelling_a_chain_cancels_its_running_step(w: Harness) -> None:
    turn = await w.start('***CALL_TOOL local__blocked {"name": "fetch"}', agent="post_writer")
    await eventually(lambda: started == ["fetch"], "the chain's first step called its tool")
    await turn.cancel()
    with pytest.raises(TurnCancelledError) as raised:
        await turn.result()
    assert raised.value.result is not None
    assert raised.value.result.stop_reason == StopReason.CANCELLED
    step = child_id(turn.workflow_id, 1, "fetcher")
    described = await w.client.get_workflow_handle(step).describe()
    assert described.status == WorkflowExecutionStatus.CANCELED


async def test_a_router_asks_its_model_and_hands_the_turn_to_the_agent_it_names(
    w: Harness,
) -> None:
    # The passthrough router echoes the request: a routing answer naming the fetcher.
    choice = json.dumps({"agent": "fetcher", "confidence": "high"})
    turn = await w.start(choice, agent="route")
    result = await turn.result()
    assert result.final is not None and result.final.text == choice  # the fetcher's echo
    fetcher = await get_turn(w.client, child_id(turn.workflow_id, 1, "fetcher")).result()
    assert fetcher.messages[0].text == choice
    # The routing call counts in the router's usage; the answer is the fetcher's.
    assert result.usage_by_agent["route"]["passthrough"].calls == 1
    assert [m.role for m in result.messages] == ["user", "assistant"]

    unknown = await w.run(json.dumps({"agent": "nobody", "confidence": "low"}), agent="route")
    assert unknown.final is not None
    assert unknown.final.text == (
        "A response was received, but the agent nobody was not known to the Router"
    )
    # With one agent there is nothing to choose: no model call.
    only = await w.run("anything", agent="only")
    assert only.final is not None and only.final.text == "anything"
    assert only.usage_by_agent["only"] == {}


async def test_the_router_prompt_lists_each_agent_card() -> None:
    from turnkeep.config.catalog import AgentCatalog
    from turnkeep.workflows.teams.router import ROUTING_SYSTEM_INSTRUCTION, routing_instruction

    catalog = AgentCatalog.of(Settings.model_validate({"agents": TEAM}))
    prompt = routing_instruction([catalog.agent_tool("ny"), catalog.agent_tool("london")])
    assert prompt.startswith(ROUTING_SYSTEM_INSTRUCTION)
    assert (
        '{"name":"ny","description":"New York\'s project manager."},\n{"name":"london"}' in prompt
    )


async def test_an_evaluator_optimizer_stops_when_the_evaluator_is_satisfied(w: Harness) -> None:
    verdict = {"rating": "EXCELLENT", "feedback": "fine", "needs_improvement": False}
    # The fixed response reaches the evaluator inside its prompt (and the generator too).
    turn = await w.start(f"***FIXED_RESPONSE {json.dumps(verdict)}", agent="editor")
    result = await turn.result()
    assert result.final is not None and result.final.text == json.dumps(verdict)
    evaluation = await get_turn(w.client, child_id(turn.workflow_id, 2, "fetcher")).result()
    assert evaluation.structured == verdict  # asked for fast-agent's EvaluationResult
    assert set(result.usage_by_agent) == {"editor", "writer", "fetcher"}
    assert result.usage_by_agent["writer"]["passthrough"].calls == 1


async def test_an_evaluator_optimizer_refines_at_most_max_refinements_times(w: Harness) -> None:
    """An evaluation that does not parse rates POOR and asks for improvement, as in
    fast-agent: the generator refines twice, and the first answer (none rated better) wins."""
    turn = await w.start("write a haiku", agent="editor")
    result = await turn.result()
    assert result.final is not None and result.final.text == "write a haiku"
    assert result.usage_by_agent["writer"]["passthrough"].calls == 3
    # Three evaluations of two model calls each: with tools on offer, the fetcher gives its
    # JSON in the deferred final call.
    assert result.usage_by_agent["fetcher"]["passthrough"].calls == 6
    refine = await get_turn(w.client, child_id(turn.workflow_id, 3, "writer")).result()
    assert "<rating>POOR</rating>" in refine.messages[0].text
    assert "Failed to parse evaluation" in refine.messages[0].text


async def test_a_maker_samples_until_one_answer_is_k_votes_ahead(
    client: Client, tmp_path: Path, fake_api: FakeModelApi
) -> None:
    fake_api.reset()
    fake = FakeModel(fake_api)
    long = "x" * 50
    fake.script(
        "voter", *(Reply.text(t) for t in ["Paris", long, "Lyon", "paris ", "PARIS", "Lyon"])
    )
    agents = {
        "voter": {"model": fake.model("voter")},
        "vote": {
            "type": "maker",
            "worker": "voter",
            "k": 2,
            "match_strategy": "normalized",
            "red_flag_max_length": 20,
        },
    }
    settings = make_settings(tmp_path, agents=agents)
    async with worker_harness(client, settings, fake=fake) as h:
        turn = await h.start("Capital of France?", agent="vote")
        result = await turn.result()
    # paris 1, (red-flagged), lyon 1, paris 2, paris 3: two ahead after five samples.
    assert result.final is not None and result.final.text == "Paris"
    outcome = result.final.channel_json("maker")
    assert outcome == {
        "winner": "paris",
        "votes": {"paris": 3, "lyon": 1},
        "total_samples": 5,
        "discarded_samples": 1,
        "margin": 2,
        "converged": True,
    }
    assert fake.pending("voter") == 1  # the sixth answer was never asked for
    assert result.usage_by_agent["voter"][fake.model("voter")].calls == 5


async def test_a_session_talks_to_a_workflow_agent_turn_after_turn(w: Harness) -> None:
    """Each message is a turn of the chain; the session keeps every exchange."""
    session = await w.session(agent="post_writer")
    for line in ["first", "second"]:
        sent = await session.send(line)
        seen = [m.text async for m in session.messages(0, until_turn=sent.turn)]
    assert seen == ["first", "first", "second", "second"]
    await session.close()


def planned(*tasks: tuple[str, str], complete: bool = False) -> Reply:
    """A planner's answer: the next step, with ``(agent, task)`` tasks."""
    step = {
        "description": "next",
        "tasks": [{"description": task, "agent": agent} for agent, task in tasks],
        "is_complete": complete,
    }
    return Reply.text(json.dumps(step))


async def test_a_planner_stops_at_plan_iterations_or_at_an_agent_it_does_not_have(
    client: Client, tmp_path: Path, fake_api: FakeModelApi
) -> None:
    """fast-agent's iterative planner: each step's tasks are child turns; the plan stops after
    ``plan_iterations`` steps, or when a step names an agent the planner does not have, and the
    planner's model answers from what was done, told why the plan stopped."""
    fake_api.reset()
    fake = FakeModel(fake_api)
    agents = {
        "writer": {"model": "passthrough"},
        "plan": {
            "type": "iterative_planner",
            "model": fake.model("planner"),
            "agents": ["writer"],
            "plan_iterations": 2,
        },
    }
    fake.script(
        "planner",
        planned(("writer", "draft one")),
        planned(("writer", "draft two"), ("writer", "draft three")),
        Reply.text("Drafted."),
        planned(("ghost", "haunt")),
        Reply.text("Could not plan."),
    )
    settings = make_settings(tmp_path, agents=agents)
    async with worker_harness(client, settings, fake=fake) as h:
        turn = await h.start("Write it", agent="plan")
        result = await turn.result()
        refused = await h.run("Haunt it", agent="plan")
    assert result.final is not None and result.final.text == "Drafted."
    # Two steps, the second's two writer tasks one after another, each its own child turn.
    third = await get_turn(h.client, child_id(turn.workflow_id, 2, "2-writer")).result()
    assert "draft three" in third.messages[0].text
    # The writer (passthrough) echoed its task: the results reached the synthesis.
    synthesis = json.dumps(fake.requests("planner")[2].body)
    assert "Reached maximum number of iterations (2)" in synthesis
    assert "draft one" in synthesis and "draft three" in synthesis
    assert result.usage_by_agent["writer"]["passthrough"].calls == 3
    assert result.usage_by_agent["plan"][fake.model("planner")].calls == 3

    assert refused.final is not None and refused.final.text == "Could not plan."
    assert "Invalid agent names found (ghost)" in json.dumps(fake.requests("planner")[4].body)
    assert fake.pending("planner") == 0


async def test_a_planner_whose_plan_cannot_be_read_answers_from_nothing_done(
    client: Client, tmp_path: Path
) -> None:
    """The passthrough planner echoes its planning prompt, which is no plan: the plan stops,
    as fast-agent's does, and the planner answers (here: echoes) the synthesis prompt."""
    agents = {
        "writer": {"model": "passthrough"},
        "plan": {"type": "orchestrator", "model": "passthrough", "agents": ["writer"]},
    }
    settings = make_settings(tmp_path, agents=agents)
    async with worker_harness(client, settings) as h:
        result = await h.run("Write it", agent="plan")
    assert result.final is not None
    assert "The plan was stopped because Failed to generate plan" in result.final.text
    assert "No steps executed yet" in result.final.text
    assert result.usage["passthrough"].calls == 2  # the plan that was none, the answer


async def test_a_planner_needs_agents() -> None:
    with pytest.raises(ValueError, match="an orchestrator agent needs `agents` to plan for"):
        Settings.model_validate({"agents": {"plan": {"type": "orchestrator"}}})
