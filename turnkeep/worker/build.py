"""Building a turnkeep worker that turnkeep owns (``turnkeep worker``, the tests, the
benchmarks): a Temporal ``Worker`` with ``TurnkeepPlugin``, as an application builds one."""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from turnkeep.activities.hooks import Hook
from turnkeep.config.agents import Agent, McpServer
from turnkeep.config.settings import Settings
from turnkeep.providers.base import ModelProvider
from turnkeep.tools.source import ToolSource
from turnkeep.worker.plugin import FunctionTools, TurnkeepPlugin
from turnkeep.worker.runner import WORKFLOW_RUNNER
from turnkeep.workflows.approval import ApprovalPolicy


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
    """A worker serving turns only, on ``task_queue`` (else ``settings.task_queue``).
    ``worker_options`` go to ``Worker``; the rest to ``TurnkeepPlugin``."""
    # The worker runs no one else's workflows, so it may share turnkeep's workflow modules on
    # turnkeep's faster runner (turnkeep/worker/workflow_runner.py).
    worker_options.setdefault("workflow_runner", WORKFLOW_RUNNER)
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
    return Worker(
        client, task_queue=task_queue or settings.task_queue, plugins=[plugin], **worker_options
    )


def freeze_startup_heap() -> None:
    """For a process that serves turns for long (``turnkeep worker``, the benchmarks): once the
    worker is built, take everything alive (the SDKs, FastMCP, pydantic's schemas: ~160,000
    objects) out of the cyclic garbage collector's scans. It would otherwise walk them all in
    every full collection: measured on the bench's worker, a ~120 ms pause once every ~8
    twenty-iteration turns, and 1.0-1.3 s of each 100-turn batch in collections (0.4-0.8 s
    frozen). Those objects live as long as the process anyway; the collection before the
    freeze frees what is already garbage."""
    gc.collect()
    gc.freeze()


# Objects allocated, less those freed, between two collections of the youngest generation
# (Python's default: 700 on 3.11 and 3.12, 2,000 on 3.13).
YOUNG_GENERATION_THRESHOLD = 50_000


def tune_garbage_collector() -> None:
    """For a process that serves turns for long (``turnkeep worker``, the benchmarks), once
    the worker is built: ``freeze_startup_heap``, and collect the youngest generation every
    50,000 allocations instead of Python's default.

    A turn builds its conversation as objects (thousands of messages in a long session's
    later turns) and drops them when it ends. Collected every few hundred allocations, most
    of them live through enough collections to reach the oldest generation, where only a full
    collection, which walks every live object, frees them, and the collector's time per
    turn grows with the session (``bench``'s ``sessions``). Collected less often, far more
    die young, where freeing them is cheap. What may wait for a collection in between is a
    few MB."""
    freeze_startup_heap()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *gc.get_threshold()[1:])
