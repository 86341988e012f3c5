"""The commands that set up and serve a namespace: ``setup`` registers turnkeep's search
attributes on it, ``worker`` runs a worker for its turns until stopped."""

from __future__ import annotations

import asyncio
import ctypes
from typing import Annotated, Any

import typer
from rich.markup import escape
from temporalio.client import Client

from turnkeep.cli.console import console
from turnkeep.cli.options import Address, ConfigPath, Namespace
from turnkeep.cli.process import in_process_worker, with_streaming
from turnkeep.cli.target import Target
from turnkeep.client.connection import connect
from turnkeep.config.files import load_settings
from turnkeep.observability.search_attributes import WANTED, Registration, register, type_name
from turnkeep.observability.setup import start_worker_observability
from turnkeep.worker.build import tune_garbage_collector
from turnkeep.worker.shutdown import WorkerService, worker_settings

GracefulShutdown = Annotated[
    str | None,
    typer.Option(
        help="On SIGTERM/SIGINT, how long running activities get to finish (`30s`, `2m`; "
        "default: worker.graceful_shutdown, else 30s).",
        show_default=False,
    ),
]
HealthAddress = Annotated[
    str | None,
    typer.Option(
        help="HOST:PORT serving GET /healthz and /readyz for probes (default: worker.health).",
        show_default=False,
    ),
]
MetricsAddress = Annotated[
    str | None,
    typer.Option(
        help="HOST:PORT serving Prometheus metrics at /metrics, e.g. 127.0.0.1:9464 "
        "(default: observability.metrics).",
        show_default=False,
    ),
]

StreamAddress = Annotated[
    str | None,
    typer.Option(
        "--stream",
        help="HOST:PORT serving the live text of this worker's model calls to watchers "
        "(default: streaming.listen; off when neither is set).",
        show_default=False,
    ),
]

app = typer.Typer()


@app.command()
def setup(address: Address = None, namespace: Namespace = None, config: ConfigPath = None) -> None:
    """Register turnkeep's search attributes (TurnkeepAgent, TurnkeepModel, TurnkeepStatus,
    TurnkeepStopReason, TurnkeepIterations, TurnkeepTokens) on the namespace, so turns can be
    filtered by them. Once per namespace; running it again changes nothing."""

    async def go(client: Client) -> Registration:
        console.print(f"namespace [bold]{escape(client.namespace)}[/]")
        return await register(client)

    found = Target.of(address, namespace, config).run(go)
    for name in found.present:
        verb = "added" if name in found.added else "already registered"
        console.print(f"{verb}: {name} ({type_name(WANTED[name])})")
    for name, kind in found.conflicting.items():
        console.print(
            f"[red]conflict:[/] {name} is registered as {kind} but turnkeep needs "
            f"{type_name(WANTED[name])}, so turns will not set it. Temporal cannot change the "
            f"type: remove it (`temporal operator search-attribute remove --name {name}`) and "
            "run `turnkeep setup` again."
        )
    if found.conflicting:
        raise typer.Exit(1)


@app.command("worker")
def run_worker(
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    graceful_shutdown: GracefulShutdown = None,
    health: HealthAddress = None,
    metrics: MetricsAddress = None,
    stream: StreamAddress = None,
) -> None:
    """Run a worker for TurnWorkflow against a Temporal server (connection from the env).
    SIGTERM or SIGINT shuts it down gracefully (docs/operations/worker.md)."""
    settings = load_settings(config)
    if stream is not None:
        settings = with_streaming(settings, stream)
    service = WorkerService(
        worker_settings(settings.worker, graceful_shutdown=graceful_shutdown, health=health)
    )

    # Before the client connects: it takes the runtime that serves the metrics.
    for line in start_worker_observability(settings.observability, metrics=metrics):
        console.print(f"[dim]{escape(line)}[/]")

    async def go() -> None:
        async with service:
            client = await service.connecting(connect(address, namespace, settings=settings))
            options: dict[str, Any] = {"graceful_shutdown_timeout": service.grace}
            if settings.worker.max_cached_workflows is not None:
                options["max_cached_workflows"] = settings.worker.max_cached_workflows
            worker = in_process_worker(client, settings, config, **options)
            async with service.serving(worker):
                console.print(
                    f"worker on task queue [bold]{settings.task_queue}[/] and its agents' "
                    f"queues ({escape(', '.join(worker.task_queues[1:]))}) · agents: "
                    + ", ".join(settings.agents)
                    + f" · config: {escape(str(settings.config_file or 'none'))}"
                )
                tune_garbage_collector()
                _release_large_blocks()
                await service.until_signalled()

    asyncio.run(go())


# glibc's mallopt parameter for the size from which a block gets its own mapping.
_M_MMAP_THRESHOLD = -3


def _release_large_blocks() -> None:
    """Give every block of 128 KiB or more its own mapping, returned to the system when freed.

    By default glibc raises that threshold to the size of each large block freed, up to
    32 MB, so after one large tool result every later result, model input and payload of that
    size is carved from the heap, which it does not give back: the worker would keep its peak
    memory for good. Fixing the threshold turns the adjustment off. Only on glibc; elsewhere
    nothing changes."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, 128 * 1024)
