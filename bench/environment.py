"""One freshly started embedded dev server with the workers every in-process benchmark uses.

- the turn worker (``build_worker``, as the CLI builds it) on ``TURNS``, serving one playback
  agent per ``Agent`` the run needs;
- the floor worker (bare Temporal: default data converter, turnkeep's sandbox) on ``FLOOR``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxRestrictions

from bench.carry_floor import ACTIVITIES as CARRY_ACTIVITIES
from bench.carry_floor import CarryFloor
from bench.floor import ACTIVITIES, Floor
from bench.turns import TOOLS, Agent, settings
from turnkeep.client.connection import connect
from turnkeep.config.settings import Settings
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.worker.build import build_worker, tune_garbage_collector
from turnkeep.worker.runner import PASSTHROUGH_MODULES, TurnkeepWorkflowRunner

TURNS = "bench-turns"
FLOOR = "bench-floor"


@dataclass(frozen=True)
class Environment:
    info: ServerInfo
    server_log: Path
    tmp: Path
    settings: Settings
    client: Client  # turnkeep's data converter, the settings' payload storage
    plain: Client  # Temporal's defaults, for the floors

    @property
    def payloads(self) -> Path:
        return self.tmp / "payloads"


def turn_worker(env: Environment, queue: str, **options: Any) -> Worker:
    """A worker for the benchmark agents, built as the CLI builds one."""
    return build_worker(env.client, env.settings, function_tools=TOOLS, task_queue=queue, **options)


# turnkeep's workflow runner, with the floors' module shared across runs as turnkeep's own
# workflow modules are: neither side re-imports (or, without .pyc files, recompiles) its
# workflow code for each workflow it starts.
FLOOR_RUNNER = TurnkeepWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules(
        *PASSTHROUGH_MODULES, "bench.floor", "bench.carry_floor"
    )
)


def floor_worker(client: Client, queue: str, **options: Any) -> Worker:
    """A bare worker for the floors, on ``FLOOR_RUNNER``. With the default runner, every new
    workflow in a process that has imported fastmcp (as any turnkeep worker has) re-imports
    beartype, a cost per workflow started that a floor must not be charged for."""
    options.setdefault("workflow_runner", FLOOR_RUNNER)
    options.setdefault("workflows", [Floor])
    options.setdefault("activities", ACTIVITIES)
    return Worker(client, task_queue=queue, **options)


def carry_worker(env: Environment, queue: str) -> Worker:
    """A worker for the carrying floor (``bench.carry_floor``), on turnkeep's data converter and
    payload storage (the turns' client)."""
    return floor_worker(env.client, queue, workflows=[CarryFloor], activities=CARRY_ACTIVITIES)


@contextlib.asynccontextmanager
async def environment(tmp: Path, agents: Iterable[Agent]) -> AsyncIterator[Environment]:
    log = tmp / "temporal.log"
    async with EmbeddedServer(ui=False, log_file=log) as info:
        worker_settings = settings(tmp, agents)
        client = await connect(info.address, info.namespace, settings=worker_settings)
        plain = await Client.connect(info.address, namespace=info.namespace)
        env = Environment(info, log, tmp, worker_settings, client, plain)
        async with (
            turn_worker(env, TURNS),
            floor_worker(plain, FLOOR),
        ):
            # As `turnkeep worker` does: the process's start-up heap is not scanned again.
            tune_garbage_collector()
            yield env
