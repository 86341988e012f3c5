"""Building a turnkeep worker: the one place the CLI, tests and benchmarks get one from."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.settings import Settings
from worker.plugin import FunctionTools, TurnkeepPlugin


def build_worker(
    client: Client,
    settings: Settings,
    *,
    function_tools: FunctionTools | None = None,
    task_queue: str | None = None,
    **worker_options: Any,
) -> Worker:
    return Worker(
        client,
        task_queue=task_queue or settings.task_queue,
        plugins=[TurnkeepPlugin(settings, function_tools=function_tools)],
        **worker_options,
    )
