"""Teams in any worker layout: a chain, or an agent that calls an agent as a tool, runs to
completion with ``TurnkeepPlugin`` (or fast-agent's ``fast.plugin()``) on one ``Worker`` of an
application's own, on the application's queue, as the README's "In your own Temporal app"
shows; under ``build_workers`` the children still go to their agents' own queues; a team whose
member the worker lacks is refused before the worker starts. On the real dev server, with the
passthrough model (each agent echoes its message)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.app_workflow import AppWorkflow, app_activity
from tests.child_turn_workflows import AskTwice
from tests.conftest import make_settings
from turnkeep import Agent, TurnInput, TurnkeepPlugin, connect, start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.fastagent.app import FastAgent
from turnkeep.testing import harness as worker_harness
from turnkeep.workflows.agent_tools import child_id

T = TypeVar("T")

README = Path(__file__).resolve().parent.parent / "README.md"

# What a team needs here: a chain of two agents, and an agent that calls one as a tool.
WRITER = Agent(name="writer", model="passthrough", description="Writes what it is asked.")
EDITOR = Agent(name="editor", model="passthrough")
POST = Agent(name="post", type="chain", sequence=["writer", "editor"])
DESK = Agent(name="desk", model="passthrough", agents=["writer"])
TEAM = [WRITER, EDITOR, POST, DESK]


async def finished(result: Awaitable[T]) -> T:
    """``result``, or a failure naming the hang this file is about (not the test's timeout)."""
    try:
        return await asyncio.wait_for(result, timeout=120)
    except TimeoutError:
        pytest.fail("the turn never finished: a child turn waits on a queue nothing polls")


def call(agent: str, message: str) -> str:
    """A prompt that makes the passthrough model call ``agent`` as a tool with ``message``."""
    return f"***CALL_TOOL agent__{agent} {json.dumps({'message': message})}"


def readme_agents() -> list[Agent]:
    """The agents of the README's "In your own Temporal app" example, its block run as a module
    but for its last line, ``asyncio.run(main())``; each agent that names a model on the
    passthrough model instead."""
    section = README.read_text(encoding="utf-8").split("## In your own Temporal app", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    code = block.replace("asyncio.run(main())", "")
    assert code != block
    namespace: dict[str, Any] = {"__name__": "readme_app"}
    exec(compile(code, str(README), "exec"), namespace)
    return [
        agent.model_copy(update={"model": "passthrough"}) if agent.model else agent
        for agent in namespace.values()
        if isinstance(agent, Agent)
    ]


async def task_queue_of(client: Client, workflow_id: str) -> str:
    return (await client.get_workflow_handle(workflow_id).describe()).task_queue


@pytest.mark.parametrize("plugin_on", ["client", "worker"])
async def test_the_readmes_chain_runs_on_one_app_worker_on_the_apps_queue(
    temporal: ServerInfo, tmp_path: Path, plugin_on: Literal["worker", "client"]
) -> None:
    """The README's example: the plugin on the app's client (or on its one Worker), on the
    app's queue, with the settings' own task_queue left at turnkeep's default; its chain, and
    an agent that calls one of its agents as a tool."""
    agents = readme_agents()
    [chain] = [agent for agent in agents if agent.type == "chain"]
    first, second = chain.sequence
    desk = Agent(name="desk", model="passthrough", agents=[first])
    settings = make_settings(tmp_path)
    plugin = TurnkeepPlugin(settings, agents=[*agents, desk])
    queue = f"my-app-{uuid.uuid4().hex[:8]}"
    client = await Client.connect(
        temporal.address,
        namespace=temporal.namespace,
        plugins=[plugin] if plugin_on == "client" else [],
    )
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[AppWorkflow],
        activities=[app_activity],
        plugins=[plugin] if plugin_on == "worker" else [],
    )
    starter = await connect(temporal.address, temporal.namespace, settings=settings)
    async with worker:
        turn = TurnInput(agent=chain.name, messages=["a post"])
        chain_turn = await start_turn(starter, turn, task_queue=queue)
        chained: TurnResult = await finished(chain_turn.result())
        turn = TurnInput(agent="desk", messages=[call(first, "a draft")])
        desk_turn = await start_turn(starter, turn, task_queue=queue)
        called: TurnResult = await finished(desk_turn.result())
        # The app's own workflow still runs beside them.
        greeting = await finished(
            client.execute_workflow(
                AppWorkflow.run, "ada", id=f"app-{uuid.uuid4().hex}", task_queue=queue
            )
        )

    assert chained.stop_reason == StopReason.END_TURN
    assert chained.final is not None and chained.final.text == "a post"
    assert set(chained.usage_by_agent) == {chain.name, first, second}
    # Each step ran beside its parent, on the app's queue.
    for step, agent in ((1, first), (2, second)):
        assert await task_queue_of(starter, child_id(chain_turn.workflow_id, step, agent)) == queue

    assert called.stop_reason == StopReason.END_TURN
    [results] = [m.tool_results for m in called.messages if m.tool_results]
    assert [r.text for r in results.values()] == ["a draft"]
    assert not any(r.is_error for r in results.values())
    assert set(called.usage_by_agent) == {"desk", first}
    assert greeting == "hello, ada"


async def test_a_team_is_one_step_of_an_apps_workflow(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    """``run_turn`` of a chain from the app's own workflow, on the app's one worker: the chain's
    steps are grandchildren of the app's workflow, on its queue."""
    settings = make_settings(tmp_path)
    chain = Agent(name="test", type="chain", sequence=["writer", "editor"])
    queue = f"my-app-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[AskTwice],
        plugins=[TurnkeepPlugin(settings, agents=[WRITER, EDITOR, chain])],
    )
    async with worker:
        result = await finished(
            client.execute_workflow(
                AskTwice.run,
                args=["first", "second"],
                id=f"app-{uuid.uuid4().hex}",
                task_queue=queue,
                result_type=TurnResult,
            )
        )
    assert result.final is not None and result.final.text == "second"
    # The second turn carried on the first's conversation.
    assert [m.text for m in result.history if m.role == "user"] == ["first", "second"]


async def test_fast_agents_plugin_runs_a_chain_on_an_apps_worker(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    fast = FastAgent("app")

    @fast.agent(name="writer", model="passthrough")
    async def writer() -> None: ...

    @fast.agent(name="editor", model="passthrough")
    async def editor() -> None: ...

    @fast.chain(name="post", sequence=["writer", "editor"])
    async def post() -> None: ...

    queue = f"my-app-{uuid.uuid4().hex[:8]}"
    settings = make_settings(tmp_path)
    async with Worker(client, task_queue=queue, plugins=[fast.plugin(settings)]):
        turn = await start_turn(client, TurnInput(agent="post", messages=["hi"]), task_queue=queue)
        result = await finished(turn.result())
    assert result.final is not None and result.final.text == "hi"
    assert set(result.usage_by_agent) == {"post", "writer", "editor"}


async def test_under_build_workers_children_keep_to_their_agents_queues(
    client: Client, tmp_path: Path
) -> None:
    """``turnkeep worker``'s layout: a worker per agent's queue, and each child turn on its
    agent's queue, which only workers that have that agent poll, whatever else shares the
    worker's own queue."""
    queue = f"shared-{uuid.uuid4().hex[:8]}"
    settings = Settings(base_dir=tmp_path)
    async with worker_harness(client, settings, agents=TEAM, task_queue=queue) as h:
        turn = await start_turn(
            client, TurnInput(agent="post", messages=["a post"]), task_queue=f"{queue}.post"
        )
        result = await finished(turn.result())
    assert result.final is not None and result.final.text == "a post"
    for step, agent in ((1, "writer"), (2, "editor")):
        child = child_id(turn.workflow_id, step, agent)
        assert await task_queue_of(h.client, child) == f"{queue}.{agent}"


def test_an_app_worker_lacking_a_teams_member_refuses_to_start(tmp_path: Path) -> None:
    """No layout runs a team whose member no worker of its config has: the plugin refuses it
    before any worker polls, saying what to do, rather than leaving a parent to wait."""
    with pytest.raises(ValueError) as refused:
        TurnkeepPlugin(make_settings(tmp_path), agents=[WRITER, POST])
    message = str(refused.value)
    assert "agent 'post' calls agent(s) ['editor'], which are not in this worker's agents" in (
        message
    )
    assert "declare them in this worker's config too" in message
