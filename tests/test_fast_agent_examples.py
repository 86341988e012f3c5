"""fast-agent's own workflow examples run on turnkeep with one import changed: each file is
loaded with ``from fast_agent import FastAgent`` pointed at ``turnkeep.compat.fastagent``, its
decorators declare the agents, and a worker serves them on the real dev server. The passthrough
model stands in for the examples' models, and function tools for their MCP servers (``fetch``,
``time``), so each step is scripted and checkable."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.conftest import make_settings
from turnkeep.compat.fastagent import FastAgent
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.testing.fake_model import FakeModel
from turnkeep.workflows.agent_tools import child_id
from turnkeep.workflows.messages import StopReason

pytestmark = pytest.mark.asyncio

EXAMPLES = Path(__file__).parent / "fast_agent_examples"


def load(name: str) -> FastAgent:
    """The example's ``fast``, loaded with its one import changed."""
    source = (EXAMPLES / f"{name}.py").read_text(encoding="utf-8")
    changed = source.replace(
        "from fast_agent import FastAgent", "from turnkeep.compat.fastagent import FastAgent"
    )
    assert changed != source, "the example imports FastAgent from fast_agent"
    module = types.ModuleType(f"fast_agent_example_{name}")
    exec(compile(changed, str(EXAMPLES / f"{name}.py"), "exec"), module.__dict__)
    fast: FastAgent = module.fast
    return fast


def fetch(url: str) -> str:
    """Stands in for the `fetch` MCP server."""
    return f"the page at {url}"


def get_current_time(timezone: str) -> str:
    """Stands in for the `time` MCP server."""
    return f"12:00 in {timezone}"


def settings_for(tmp_path: Path, **config: Any) -> Any:
    return make_settings(tmp_path, default_model="passthrough", **config)


async def test_chaining_example(client: Client, tmp_path: Path) -> None:
    fast = load("chaining")
    assert {a.name for a in fast.agents} == {"url_fetcher", "social_media", "post_writer"}
    async with worker_harness(
        client,
        settings_for(tmp_path),
        agents=fast.agents,
        function_tools={"fetch": [fetch]},
    ) as h:
        turn = await h.start(
            '***CALL_TOOL fetch__fetch {"url": "https://llmindset.co.uk"}', agent="post_writer"
        )
        result = await turn.result()
    # url_fetcher fetched the page; social_media was given that summary and (passthrough)
    # wrote it back as the post.
    assert result.stop_reason == StopReason.END_TURN
    assert result.final is not None
    assert result.final.text == "the page at https://llmindset.co.uk"
    fetched = await h.client.get_workflow_handle(
        child_id(turn.workflow_id, 1, "url_fetcher")
    ).describe()
    assert fetched.parent_id == turn.workflow_id


async def test_agents_as_tools_simple_example(client: Client, tmp_path: Path) -> None:
    fast = load("agents_as_tools_simple")
    [pmo] = [a for a in fast.agents if a.name == "PMO-orchestrator"]
    assert pmo.agents == ["NY-Project-Manager", "London-Project-Manager"]
    async with worker_harness(
        client,
        settings_for(tmp_path),
        agents=fast.agents,
        function_tools={"time": [get_current_time]},
    ) as h:
        ny = '***CALL_TOOL time__get_current_time {"timezone": "America/New_York"}'
        london = '***CALL_TOOL time__get_current_time {"timezone": "Europe/London"}'
        prompt = "\n".join(
            f"***CALL_TOOL agent__{agent} {json.dumps({'message': message})}"
            for agent, message in [("NY-Project-Manager", ny), ("London-Project-Manager", london)]
        )
        result = await h.run(prompt, agent="PMO-orchestrator")
    assert result.final is not None
    assert result.final.text == "12:00 in America/New_York\n12:00 in Europe/London"
    assert set(result.usage_by_agent) == {
        "PMO-orchestrator",
        "NY-Project-Manager",
        "London-Project-Manager",
    }


async def test_evaluator_example(client: Client, tmp_path: Path, fake_api: FakeModelApi) -> None:
    """Its generator on gpt-5-nano and evaluator on o3-mini, both OpenAI models the fake API
    answers: the first evaluation asks for a refinement, the second rates it EXCELLENT."""
    fast = load("evaluator")
    fake_api.reset()
    fake = FakeModel(fake_api, provider="openai")
    fake.script("gpt-5-nano", Reply.text("Dear LastMile AI, ..."), Reply.text("Dear team, ..."))
    poor = {"rating": "FAIR", "feedback": "More detail", "needs_improvement": True}
    great = {"rating": "EXCELLENT", "feedback": "Done", "needs_improvement": False}
    fake.script("o3-mini", Reply.text(json.dumps(poor)), Reply.text(json.dumps(great)))
    async with worker_harness(
        client,
        settings_for(tmp_path),
        agents=fast.agents,
        fake=fake,
        function_tools={"fetch": [fetch]},
    ) as h:
        result = await h.run("Write a cover letter", agent="cover_letter_writer")
    assert result.final is not None and result.final.text == "Dear team, ..."
    # The refinement prompt carried the evaluator's feedback to the generator.
    refinement = json.dumps(fake.requests("gpt-5-nano")[1].body)
    assert "More detail" in refinement and "<rating>FAIR</rating>" in refinement
    # The evaluator was asked for fast-agent's EvaluationResult.
    assert "needs_improvement" in json.dumps(fake.requests("o3-mini")[0].body)
    assert fake.pending("gpt-5-nano") == fake.pending("o3-mini") == 0


async def test_router_example(client: Client, tmp_path: Path, fake_api: FakeModelApi) -> None:
    """The router on sonnet names the general assistant (haiku), which answers."""
    fast = load("router")
    fake_api.reset()
    fake = FakeModel(fake_api)
    choice = {"agent": "general_assistant", "confidence": "high", "reasoning": "general"}
    fake.script("claude-sonnet-5", Reply.text(json.dumps(choice)))
    fake.script("claude-haiku-4-5", Reply.text("Keep the bees calm."))
    async with worker_harness(
        client,
        settings_for(tmp_path),
        agents=fast.agents,
        fake=fake,
        function_tools={"fetch": [fetch], "filesystem": [fetch]},
    ) as h:
        result = await h.run("What are the key principles of beekeeping?", agent="route")
    assert result.final is not None and result.final.text == "Keep the bees calm."
    routing = json.dumps(fake.requests("claude-sonnet-5")[0].body)
    assert '\\"name\\":\\"general_assistant\\"' in routing  # the agents' cards


async def test_maker_example(client: Client, tmp_path: Path, fake_api: FakeModelApi) -> None:
    """The classifier on claude-haiku-4-5, sampled until one class is k votes ahead."""
    fast = load("maker")
    [maker] = [a for a in fast.agents if a.type == "maker"]
    fake_api.reset()
    fake = FakeModel(fake_api)
    fake.script("claude-haiku-4-5", *(Reply.text(c) for c in ["COMPLAINT"] * maker.k))
    async with worker_harness(client, settings_for(tmp_path), agents=fast.agents, fake=fake) as h:
        result = await h.run("This product is broken!", agent=maker.name)
    assert result.final is not None and result.final.text == "COMPLAINT"
    outcome = result.final.channel_json("maker")
    assert outcome is not None and outcome["converged"] and outcome["total_samples"] == maker.k
