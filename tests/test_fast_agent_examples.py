"""fast-agent's own workflow examples run on turnkeep with one import changed.

The examples are read from fast-agent's published wheel (``fast-agent-mcp``, which ships them
as package resources for ``fast-agent quickstart workflow``), downloaded by ``make env`` into
the virtual environment, never copied into this repository. Each file is loaded with ``from
mcp_agent.core.fastagent import FastAgent`` pointed at ``turnkeep.fastagent.app``; its
decorators declare the agents, and a worker serves them on the real dev server. The fake model
API answers the models the examples name (scripted per model), the passthrough model stands in
where an example names none, and function tools stand in for their MCP servers (``fetch``,
``filesystem``), so each step is scripted and checkable."""

from __future__ import annotations

import json
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.conftest import make_settings
from tests.test_agent_tools import planned
from turnkeep.contract.messages import StopReason
from turnkeep.fastagent.app import FastAgent
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.testing.fake_model import FakeModel
from turnkeep.workflows.agent_tools import child_id

pytestmark = pytest.mark.asyncio

# The version the Makefile downloads: its examples are the ones these tests know.
WHEEL = Path(sys.prefix) / "fast-agent" / "fast_agent_mcp-0.2.36-py3-none-any.whl"
EXAMPLES = "mcp_agent/resources/examples/workflows"
IMPORT = "from mcp_agent.core.fastagent import FastAgent"


def load(name: str, monkeypatch: pytest.MonkeyPatch) -> FastAgent:
    """The example's ``fast``, loaded with its one import changed. Its other fast-agent
    imports (``Prompt``, used only by its ``main``, which a worker does not run) get a
    stand-in module."""
    if not WHEEL.exists():
        pytest.fail(f"fast-agent's examples come from its wheel, {WHEEL}: run `make env`")
    with zipfile.ZipFile(WHEEL) as wheel:
        source = wheel.read(f"{EXAMPLES}/{name}.py").decode("utf-8")
    changed = source.replace(IMPORT, "from turnkeep.fastagent.app import FastAgent")
    assert changed != source, "the example imports FastAgent from fast-agent"
    for module in ("mcp_agent", "mcp_agent.core", "mcp_agent.core.prompt"):
        stand_in = types.ModuleType(module)
        stand_in.Prompt = object  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module, stand_in)
    module = types.ModuleType(f"fast_agent_example_{name}")
    exec(compile(changed, f"{WHEEL.name}/{EXAMPLES}/{name}.py", "exec"), module.__dict__)
    fast: FastAgent = module.fast
    return fast


def fetch(url: str) -> str:
    """Stands in for the `fetch` MCP server."""
    return f"the page at {url}"


def read_file(path: str) -> str:
    """Stands in for the `filesystem` MCP server."""
    return f"the contents of {path}"


TOOLS: dict[str, Any] = {"fetch": [fetch], "filesystem": [read_file]}


def settings_for(tmp_path: Path, **config: Any) -> Any:
    return make_settings(tmp_path, default_model="passthrough", **config)


async def test_chaining_example(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = load("chaining", monkeypatch)
    assert {a.name for a in fast.agents} == {"url_fetcher", "social_media", "post_writer"}
    async with worker_harness(
        client, settings_for(tmp_path), agents=fast.agents, function_tools=TOOLS
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


async def test_parallel_example(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_api: FakeModelApi
) -> None:
    """Three reviewers on three models at once, and the grader (o3-mini) over their
    answers."""
    fast = load("parallel", monkeypatch)
    fake_api.reset()
    fake = FakeModel(fake_api)
    # A name with a dot is no fake model's (`.low` is a reasoning effort): scripted on the API.
    fake_api.script(Reply.text("No contradictions."), model="gpt-4.1-mini")
    fake.script("claude-sonnet-5", Reply.text("The tone wanders."))
    fake.script("o3-mini", Reply.text("Grade: B"))
    async with worker_harness(
        client, settings_for(tmp_path), agents=fast.agents, fake=fake, function_tools=TOOLS
    ) as h:
        result = await h.run("Once upon a time, a kitten found a castle.", agent="parallel")
    assert result.final is not None and result.final.text == "Grade: B"
    graded = json.dumps(fake.requests("o3-mini")[0].body)
    for review in ("No contradictions.", "The tone wanders.", "a kitten found a castle"):
        assert review in graded  # the proofreader (passthrough) echoed the story
    assert fake.pending("o3-mini") == 0


async def test_router_example(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_api: FakeModelApi
) -> None:
    """The router on sonnet names the general assistant, which answers."""
    fast = load("router", monkeypatch)
    fake_api.reset()
    fake = FakeModel(fake_api)
    choice = {"agent": "general_assistant", "confidence": "high", "reasoning": "general"}
    fake.script("claude-sonnet-5", Reply.text(json.dumps(choice)))
    async with worker_harness(
        client, settings_for(tmp_path), agents=fast.agents, fake=fake, function_tools=TOOLS
    ) as h:
        question = "What are the key principles of effective beekeeping?"
        result = await h.run(question, agent="route")
    # The general assistant (passthrough) answers with the question.
    assert result.final is not None and result.final.text == question
    routing = json.dumps(fake.requests("claude-sonnet-5")[0].body)
    assert '\\"name\\":\\"general_assistant\\"' in routing  # the agents' cards


async def test_evaluator_example(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_api: FakeModelApi
) -> None:
    """The evaluator (gpt-4o) asks for a refinement, then rates it EXCELLENT. The generator's
    model, ``haiku3``, has left fast-agent's model table since this example was written: it
    runs on ``haiku``, the one change made to the example's agents."""
    fast = load("evaluator", monkeypatch)
    agents = fast.agents
    [generator] = [a for a in agents if a.name == "generator"]
    assert generator.model == "haiku3"
    agents = [a.model_copy(update={"model": "haiku"}) if a is generator else a for a in agents]
    fake_api.reset()
    fake = FakeModel(fake_api)
    fake.script("claude-haiku-4-5", Reply.text("Dear LastMile AI, ..."), Reply.text("Dear team"))
    fair = {"rating": "FAIR", "feedback": "More detail", "needs_improvement": True}
    great = {"rating": "EXCELLENT", "feedback": "Done", "needs_improvement": False}
    fake.script("gpt-4o", Reply.text(json.dumps(fair)), Reply.text(json.dumps(great)))
    async with worker_harness(
        client, settings_for(tmp_path), agents=agents, fake=fake, function_tools=TOOLS
    ) as h:
        result = await h.run("Write a cover letter", agent="cover_letter_writer")
    assert result.final is not None and result.final.text == "Dear team"
    # The refinement prompt carried the evaluator's feedback to the generator.
    refinement = json.dumps(fake.requests("claude-haiku-4-5")[1].body)
    assert "More detail" in refinement and "<rating>FAIR</rating>" in refinement
    assert "needs_improvement" in json.dumps(fake.requests("gpt-4o")[0].body)
    assert fake.pending("claude-haiku-4-5") == fake.pending("gpt-4o") == 0


async def test_orchestrator_example(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_api: FakeModelApi
) -> None:
    """The orchestrator (on the default model, here sonnet) plans one step at a time: the
    finder (gpt-4o) and the writer (sonnet) at once, then the proofreader (gpt-4o) with what
    they found in its context; then it says the objective is met and answers from the
    results."""
    fast = load("orchestrator", monkeypatch)
    fake_api.reset()
    fake = FakeModel(fake_api)
    fake.script(
        "claude-sonnet-5",
        planned(("finder", "find the story"), ("writer", "start the report")),
        Reply.text("report started"),  # the writer, while the planner waits
        planned(("proofreader", "review the story")),
        planned(complete=True),
        Reply.text("The graded report is written."),
    )
    fake.script("gpt-4o", Reply.text("short_story.md: kittens"), Reply.text("3 errors"))
    settings = make_settings(tmp_path, default_model="sonnet")
    async with worker_harness(
        client, settings, agents=fast.agents, fake=fake, function_tools=TOOLS
    ) as h:
        turn = await h.start("Grade the student's short story", agent="orchestrate")
        result = await turn.result()
    assert result.final is not None and result.final.text == "The graded report is written."
    planner = fake.requests("claude-sonnet-5")
    # The planner knows its agents (the example's instruction has no {{agents}} of its own).
    assert '<fastagent:agent name=\\"proofreader\\">' in json.dumps(planner[0].body)
    assert "Planning Budget: 5 of 5 iterations remaining" in json.dumps(planner[0].body)
    # Step 2's task was given step 1's results as its context.
    review = json.dumps(fake.requests("gpt-4o")[1].body)
    assert "short_story.md: kittens" in review and "report started" in review
    assert "review the story" in review
    # The synthesis saw every result and why the plan stopped.
    synthesis = json.dumps(planner[-1].body)
    assert "3 errors" in synthesis and "Plan completed successfully" in synthesis
    assert fake.pending("claude-sonnet-5") == fake.pending("gpt-4o") == 0
    step_two = child_id(turn.workflow_id, 2, "1-proofreader")
    assert (await h.client.get_workflow_handle(step_two).describe()).parent_id == turn.workflow_id
    assert set(result.usage_by_agent) == {"orchestrate", "finder", "writer", "proofreader"}
