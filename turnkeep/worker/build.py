"""Building a turnkeep worker: the one place the CLI, tests and benchmarks get one from."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from turnkeep.activities.hook_activity import Hook
from turnkeep.activities.model_activity import ModelInputHandoffInterceptor
from turnkeep.settings import Settings
from turnkeep.worker.plugin import FunctionTools, TurnkeepPlugin


def build_worker(
    client: Client,
    settings: Settings,
    *,
    function_tools: FunctionTools | None = None,
    hooks: Mapping[str, Hook] | None = None,
    task_queue: str | None = None,
    model_input_handoff: bool = True,
    **worker_options: Any,
) -> Worker:
    """``model_input_handoff=False`` makes every model call read its input by query, as one
    running on another worker does (benchmarks compare the two)."""
    # A turn's next step (and the query a model call reads its input by) waits on the worker
    # that last ran it for this long before any worker may take it: after a crash, that is dead
    # time. Temporal's default is 10 s.
    worker_options.setdefault("sticky_queue_schedule_to_start_timeout", timedelta(seconds=3))
    # A model call that runs on this worker takes its input from the workflow in memory
    # instead of by query (turnkeep/activities/model_activity.py): a round trip less per iteration.
    if model_input_handoff:
        worker_options["interceptors"] = [
            *worker_options.get("interceptors", ()),
            ModelInputHandoffInterceptor(),
        ]
    return Worker(
        client,
        task_queue=task_queue or settings.task_queue,
        plugins=[TurnkeepPlugin(settings, function_tools=function_tools, hooks=hooks)],
        **worker_options,
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
