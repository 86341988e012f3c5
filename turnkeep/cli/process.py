"""What the commands that keep running do in their own process: serve turns on a worker
(``run --worker``, ``worker``) and wait for Ctrl-C or SIGTERM (``worker``, ``server``,
``codec-server``); and what the commands that start turns check before and while they wait
(``run``, ``chat``): that the turn can run at all, and that some worker polls its queue."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from turnkeep.activities.turn_setup import check_overrides
from turnkeep.cli.connect import client_for, uses_embedded
from turnkeep.cli.console import console, notes
from turnkeep.config.catalog import AgentCatalog
from turnkeep.config.files import BUILTIN_AGENT, CONFIG_NAME, ConfigError, find_config
from turnkeep.config.settings import Settings, StreamingSettings
from turnkeep.contract.turn_io import TurnOverrides
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.errors import known
from turnkeep.providers.passthrough import PassthroughProvider
from turnkeep.providers.registry import ModelCatalog
from turnkeep.worker.build import TurnkeepWorkers, build_workers

# How long a turn may wait before the command looks whether any worker polls its queue: a
# worker that is there takes a new turn's first task in milliseconds.
UNPOLLED_AFTER_SECONDS = 3.0
UNPOLLED_EVERY_SECONDS = 15.0
# A worker counts as polling when it polled this recently: a live one long-polls again at
# least every minute.
POLLED_WITHIN = timedelta(seconds=90)
RUN_A_WORKER = "start `turnkeep worker` with the agent in its config, or --worker to run one here"


def in_process_worker(
    client: Client, settings: Settings, config: Path | None, **worker_options: Any
) -> TurnkeepWorkers:
    """``build_workers``, with what the config gets wrong as a ``ConfigError``: an agent
    naming a server or hook that is not there, a hook that does not import, storage or keys
    the client does not share. ``worker_options`` go to each ``Worker``."""
    try:
        return build_workers(client, settings, **worker_options)
    except (ValueError, TypeError, ImportError, AttributeError) as err:
        where = find_config(config) or "the configuration"
        raise ConfigError(f"{where} cannot run a worker: {err}") from err


def with_streaming(settings: Settings, listen: str) -> Settings:
    """``settings`` with the live-stream server on ``listen`` (HOST:PORT), its ``advertise``
    kept."""
    current = settings.streaming or StreamingSettings()
    try:
        streaming = StreamingSettings.model_validate({**current.model_dump(), "listen": listen})
    except ValueError:  # pydantic's ValidationError; the value itself is not echoed
        raise ConfigError("--stream must be HOST:PORT, e.g. 0.0.0.0:8765") from None
    return settings.model_copy(update={"streaming": streaming})


async def until_signalled() -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()


def runs_worker(address: str | None, worker: bool | None) -> bool:
    """Whether a command that runs turns runs a worker in its process: when asked
    (``--worker``), else on the embedded server (no address given or configured), where no
    other worker would be polling."""
    return worker if worker is not None else uses_embedded(address)


def refuse_unrunnable(
    settings: Settings, agent: str, overrides: TurnOverrides, *, in_process: bool
) -> None:
    """Raise ``ConfigError`` for a turn that could only fail, before anything starts: an agent
    the config lacks, a model or an override the agent does not allow. Checked where the
    command can know: when it runs the worker itself (``in_process``), or against the config
    file it was given; without one, workers elsewhere may have agents this process does not
    know of."""
    if not in_process and settings.config_file is None:
        return
    where = settings.config_file or "the default configuration"
    if agent not in settings.agents:
        raise ConfigError(
            f"no agent {agent!r} in {where} (its agents: {known(settings.agents)}); nothing "
            "was started"
        )
    try:
        # The very check prepare_turn makes, so the two can never disagree.
        check_overrides(AgentCatalog.of(settings), ModelCatalog(settings), agent, overrides)
    except ApplicationError as err:
        # In the words of every other refusal: the cause, lowercase, then what happened.
        cause = err.message.rstrip(".")
        cause = cause[:1].lower() + cause[1:] if cause[1:2].islower() else cause
        raise ConfigError(f"{cause}; nothing was started ({err.type})") from None


def ready_to_start(
    settings: Settings, agent: str, overrides: TurnOverrides, *, in_process: bool
) -> None:
    """What a command that starts turns of ``agent`` (``run``, ``chat``) checks and says before
    anything starts: ``refuse_unrunnable``, then ``note_builtin_agent``."""
    refuse_unrunnable(settings, agent, overrides, in_process=in_process)
    note_builtin_agent(settings, agent, in_process=in_process)


def note_builtin_agent(settings: Settings, agent: str, *, in_process: bool) -> None:
    """With no config file found, a turn on this process's worker runs the built-in agent:
    say so, once, on stderr, with the model it runs on (the one a provider's key in the
    environment gives, else passthrough, which only echoes). A worker elsewhere has its own
    config, which this process cannot speak for."""
    if settings.config_file is not None or not in_process or agent != BUILTIN_AGENT:
        return
    model = ModelCatalog(settings).default_model()
    echoes = ", which echoes the prompt back" if model == PassthroughProvider.name else ""
    notes.print(
        f"[yellow]no config found[/] (no {CONFIG_NAME} here, nor fast-agent's): running the "
        f"built-in agent {agent!r} on model {model}{echoes}"
    )


async def warn_if_unpolled(
    client: Client,
    task_queue: str,
    *,
    after: float = UNPOLLED_AFTER_SECONDS,
    every: float = UNPOLLED_EVERY_SECONDS,
    what: str = "the turn",
    hint: str = RUN_A_WORKER,
) -> None:
    """Once no worker polls ``task_queue`` (the server knows: it lists a queue's recent
    pollers), say so, once: ``what`` waits there until one does, and the command keeps
    waiting too; ``hint`` says how to get one. Looks after ``after`` seconds, then every
    ``every``. Cancel it once the workflow has moved on."""
    await asyncio.sleep(after)
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    while True:
        try:
            described = await client.workflow_service.describe_task_queue(request)
        except RPCError:
            return  # a server (or a role) that does not describe queues: nothing to say
        # The server lists a worker that has gone for some minutes after its last poll; a
        # live one polls again at least every minute.
        recent = datetime.now(UTC) - POLLED_WITHIN
        if not any(p.last_access_time.ToDatetime(UTC) > recent for p in described.pollers):
            break
        await asyncio.sleep(every)
    console.print(
        f"[yellow]no worker is polling task queue {task_queue}[/] on "
        f"{client.service_client.config.target_host}: {what} waits there until one does "
        f"({hint}); still waiting…"
    )


@asynccontextmanager
async def client_and_worker(
    address: str | None,
    namespace: str | None,
    settings: Settings,
    config: Path | None,
    *,
    worker: bool | None,
) -> AsyncIterator[tuple[Client, ServerInfo | None]]:
    """The client a command that runs turns talks through, with a worker in this process while
    it runs when asked (``--worker``), or by default on the embedded server, where no other
    worker would be polling."""
    client, embedded = await client_for(
        address, namespace, settings, config_file=find_config(config)
    )
    if not runs_worker(address, worker):
        yield client, embedded
        return
    # This process both runs the turn and watches it: its model calls stream to it on
    # loopback unless the config says otherwise.
    if settings.streaming is None:
        settings = with_streaming(settings, "127.0.0.1:0")
    async with in_process_worker(client, settings, config):
        yield client, embedded
