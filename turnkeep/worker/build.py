"""Building the workers turnkeep owns (``turnkeep worker``, the command line's in-process worker,
the tests, the benchmarks): Temporal ``Worker``s with ``TurnkeepPlugin``, as an application
builds one."""

from __future__ import annotations

import asyncio
import gc
import inspect
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from turnkeep.activities.hooks import Hook
from turnkeep.config.agents import Agent, McpServer
from turnkeep.config.settings import Settings
from turnkeep.contract.approval import ApprovalPolicy
from turnkeep.contract.turn_io import agent_task_queue
from turnkeep.providers.base import ModelProvider
from turnkeep.tools.source import ToolSource
from turnkeep.worker.plugin import FunctionTools, TurnkeepPlugin
from turnkeep.worker.runner import WORKFLOW_RUNNER


def build_worker(
    client: Client,
    settings: Settings,
    *,
    agents: Sequence[Agent] = (),
    servers: Sequence[McpServer] = (),
    function_tools: FunctionTools | None = None,
    hooks: Mapping[str, Hook] | None = None,
    approval_policies: Mapping[str, ApprovalPolicy] | None = None,
    providers: Sequence[type[ModelProvider]] = (),
    tool_sources: Sequence[type[ToolSource]] = (),
    task_queue: str | None = None,
    model_input_handoff: bool = True,
    **worker_options: Any,
) -> Worker:
    """A worker serving turns only, on ``task_queue`` (else ``settings.task_queue``) alone.
    ``worker_options`` go to ``Worker``; the rest to ``TurnkeepPlugin``. A process that serves
    turns for its agents wherever turnkeep's clients start them uses ``build_workers``."""
    if task_queue is not None:
        # The agents' own queues are named after the worker's (agents called as tools run
        # there), so the settings must say which queue that is.
        settings = settings.model_copy(update={"task_queue": task_queue})
    plugin = TurnkeepPlugin(
        settings,
        agents=agents,
        servers=servers,
        function_tools=function_tools,
        hooks=hooks,
        approval_policies=approval_policies,
        providers=providers,
        tool_sources=tool_sources,
        model_input_handoff=model_input_handoff,
    )
    return _worker(client, plugin, task_queue or settings.task_queue, worker_options)


def build_workers(
    client: Client, settings: Settings, *, task_queue: str | None = None, **options: Any
) -> TurnkeepWorkers:
    """What ``turnkeep worker`` runs: a worker on ``task_queue`` (else ``settings.task_queue``)
    and one on each agent's own queue (``agent_task_queue``), sharing one ``TurnkeepPlugin``
    (its model clients, tool connections and payload sweeper). ``options`` as
    ``build_worker``'s."""
    base = build_worker(client, settings, task_queue=task_queue, **options)
    [plugin] = [p for p in base.config()["plugins"] if isinstance(p, TurnkeepPlugin)]
    worker_options = {k: v for k, v in options.items() if k not in _PLUGIN_OPTIONS}
    agent_workers = [
        _worker(client, plugin, agent_task_queue(base.task_queue, agent), worker_options)
        for agent in plugin.agents
    ]
    return TurnkeepWorkers([base, *agent_workers])


# What build_worker hands TurnkeepPlugin rather than Worker.
_PLUGIN_OPTIONS = frozenset(inspect.signature(build_worker).parameters) - {
    "client",
    "settings",
    "task_queue",
    "worker_options",
}


def _worker(
    client: Client, plugin: TurnkeepPlugin, task_queue: str, options: Mapping[str, Any]
) -> Worker:
    # The worker runs no one else's workflows, so it may share turnkeep's workflow modules on
    # turnkeep's faster runner (``turnkeep.worker.runner``).
    options = {"workflow_runner": WORKFLOW_RUNNER, **options}
    return Worker(client, task_queue=task_queue, plugins=[plugin], **options)


class TurnkeepWorkers:
    """The Temporal workers of a process that serves turns (``build_workers``): started
    together by ``async with``, running while all of them run, and shut down together, each
    stopping its polling at once and giving its running activities its grace period.

    Why a worker per agent's queue: Temporal hands a task to any worker polling its queue, so
    workers of different configs sharing one queue would take each other's turns and fail
    them (an unknown agent). On its agent's queue a turn only meets workers that have it."""

    def __init__(self, workers: Sequence[Worker]) -> None:
        self.workers = list(workers)
        self._stack: AsyncExitStack | None = None

    @property
    def task_queue(self) -> str:
        """The worker's own task queue (the agents' queues are named after it)."""
        return self.workers[0].task_queue

    @property
    def task_queues(self) -> list[str]:
        return [worker.task_queue for worker in self.workers]

    @property
    def client(self) -> Client:
        return self.workers[0].client

    @property
    def is_running(self) -> bool:
        return all(worker.is_running for worker in self.workers)

    async def __aenter__(self) -> TurnkeepWorkers:
        async with AsyncExitStack() as stack:
            for worker in self.workers:
                await stack.enter_async_context(worker)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # All at once: one after another, the last would keep taking work while the first
        # drains, and the grace periods would add up.
        await asyncio.gather(*(worker.shutdown() for worker in self.workers))
        if self._stack is not None:
            await self._stack.__aexit__(*exc)  # type: ignore[arg-type]


def freeze_startup_heap() -> None:
    """For a process that serves turns for long (``turnkeep worker``, the benchmarks): once the
    worker is built, take everything alive (the SDKs, FastMCP, pydantic's schemas) out of the
    cyclic garbage collector's scans. It would otherwise walk them all in every full
    collection: a pause every few turns, which adds up over a batch of them (the benchmarks'
    notes have the figures). Those objects live as long as the process anyway; the collection
    before the freeze frees what is already garbage."""
    gc.collect()
    gc.freeze()


# Objects allocated, less those freed, between two collections of the youngest generation
# (Python's default: 700 on 3.11 and 3.12, 2,000 on 3.13).
YOUNG_GENERATION_THRESHOLD = 50_000


def tune_garbage_collector() -> None:
    """For a process that serves turns for long (``turnkeep worker``, the benchmarks), once
    the worker is built: ``freeze_startup_heap``, and collect the youngest generation every
    ``YOUNG_GENERATION_THRESHOLD`` allocations instead of Python's default.

    A turn builds its conversation as objects (thousands of messages in a long session's
    later turns) and drops them when it ends. Collected every few hundred allocations, most
    of them live through enough collections to reach the oldest generation, where only a full
    collection, which walks every live object, frees them, and the collector's time per
    turn grows with the session (``bench``'s ``sessions``). Collected less often, far more
    die young, where freeing them is cheap. What may wait for a collection in between is a
    few MB."""
    freeze_startup_heap()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *gc.get_threshold()[1:])
