"""The ``turnkeep`` command line: run a turn and stream it, run workers and the dev server,
watch, show and cancel turns.

With no server address (no ``--address``, ``TEMPORAL_ADDRESS`` or ``TEMPORAL_PROFILE``),
``run`` uses an embedded Temporal dev server with its Web UI, started in the background on a
SQLite file under the state directory so turns and the UI outlive the command, and runs the
turn on an in-process worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from temporalio.client import Client

from activities.payload_storage import PayloadStorageConfigError
from activities.settings import Settings
from worker.build import build_worker
from worker.client import TurnCancelledError, TurnHandle, get_turn, start_turn
from worker.config import ConfigError, load_settings
from worker.connection import address_configured, connect
from worker.embedded import (
    EmbeddedServer,
    EmbeddedServerError,
    ServerInfo,
    ensure_background_server,
    state_dir,
    stop_background_server,
)
from worker.render import TurnRenderer
from workflows.turn_io import TurnInput, TurnResult

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Durable agent turns on Temporal: fast-agent's tool loop as a workflow.",
)
console = Console(highlight=False)

Address = Annotated[
    str | None, typer.Option(help="Temporal frontend host:port (default: TEMPORAL_ADDRESS).")
]
Namespace = Annotated[str | None, typer.Option(help="Temporal namespace.")]
ConfigPath = Annotated[
    Path | None, typer.Option("--config", "-c", help="turnkeep.yaml (default: ./turnkeep.yaml).")
]


def main() -> None:
    try:
        app()
    except (ConfigError, EmbeddedServerError, PayloadStorageConfigError) as err:
        console.print(f"[red]error:[/] {err}")
        raise SystemExit(2) from None


async def _connect(
    address: str | None, namespace: str | None, settings: Settings
) -> tuple[Client, ServerInfo | None]:
    """A client for the given server, or for the embedded one when none is configured. The
    settings give it the workers' payload storage, so it can read what they offload."""
    if address is None and not address_configured():
        info = await ensure_background_server()
        console.print(f"[dim]embedded Temporal server at {info.address} · Web UI {info.ui_url}[/]")
        return await connect(info.address, info.namespace, settings=settings), info
    return await connect(address, namespace, settings=settings), None


def _default_agent(settings: Settings) -> str:
    return "default" if "default" in settings.agents else next(iter(settings.agents))


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="What to ask the agent ('-' reads stdin).")],
    agent: Annotated[str | None, typer.Option(help="Agent from the config.")] = None,
    model: Annotated[str | None, typer.Option(help="Model override, if the agent allows.")] = None,
    max_iterations: Annotated[int | None, typer.Option(help="Tool-loop cap override.")] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: Annotated[
        bool | None,
        typer.Option(help="Run a worker in this process (default: only on the embedded server)."),
    ] = None,
    workflow_id: Annotated[str | None, typer.Option("--id", help="Workflow id.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the TurnResult as JSON.")] = False,
) -> None:
    """Start a turn and stream its messages as the loop runs. Ctrl-C cancels the turn."""
    settings = load_settings(config)
    if prompt == "-":
        prompt = sys.stdin.read().strip()
    turn = TurnInput(
        agent=agent or _default_agent(settings),
        messages=[prompt],  # a bare string is a user message
        model=model,
        max_iterations=max_iterations,
    )

    async def go() -> None:
        client, embedded = await _connect(address, namespace, settings)
        in_process = worker if worker is not None else embedded is not None
        runner = build_worker(client, settings) if in_process else contextlib.nullcontext()
        async with runner:
            handle = await start_turn(
                client, turn, workflow_id=workflow_id, task_queue=settings.task_queue
            )
            _announce(handle, embedded)
            result = await _stream(handle)
        if json_out:
            print(result.model_dump_json(indent=2))

    asyncio.run(go())


def _announce(handle: TurnHandle, embedded: ServerInfo | None) -> None:
    console.print(f"[bold]turn[/] {handle.workflow_id}")
    link = embedded.workflow_url(handle.workflow_id) if embedded else None
    if link:
        console.print(f"[bold]Web UI[/] {link}")


async def _stream(handle: TurnHandle, start: int = 0) -> TurnResult:
    """Print each message as it comes; on Ctrl-C cancel the turn and show the repair."""
    renderer = TurnRenderer(console)
    try:
        async for message in handle.messages(start, include_tool_results=True):
            renderer.message(message)
        result = await handle.result()
    except asyncio.CancelledError:
        # Ctrl-C cancels this task; take the cancellation back long enough to cancel the
        # turn itself and read its repaired conversation (fast-agent's uncancel trick).
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        console.print("[yellow]interrupted: cancelling the turn…[/]")
        await handle.cancel()
        try:
            result = await handle.result()
        except TurnCancelledError as cancelled:
            if cancelled.result is None:
                raise
            result = cancelled.result
    except TurnCancelledError as cancelled:
        if cancelled.result is None:
            raise
        result = cancelled.result
    renderer.summary(result)
    return result


@app.command()
def watch(
    workflow_id: str,
    start: Annotated[int, typer.Option(help="Message index to start from.")] = 0,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Attach to a turn started elsewhere and stream it."""
    settings = load_settings(config)

    async def go() -> None:
        client, _ = await _connect(address, namespace, settings)
        await _stream(get_turn(client, workflow_id), start)

    asyncio.run(go())


@app.command()
def show(
    workflow_id: str,
    address: Address = None,
    namespace: Namespace = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the TurnResult as JSON.")] = False,
    config: ConfigPath = None,
) -> None:
    """Print a turn's conversation (running, completed or cancelled)."""
    settings = load_settings(config)

    async def go() -> None:
        client, _ = await _connect(address, namespace, settings)
        result = await get_turn(client, workflow_id).current()
        if result is None:
            console.print("the turn has not started its loop yet")
            return
        if json_out:
            print(result.model_dump_json(indent=2))
            return
        renderer = TurnRenderer(console)
        for message in result.messages:
            renderer.message(message)
        renderer.summary(result)

    asyncio.run(go())


@app.command()
def cancel(
    workflow_id: str,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Cancel a running turn; its conversation is repaired and stays readable."""
    settings = load_settings(config)

    async def go() -> None:
        client, _ = await _connect(address, namespace, settings)
        handle = get_turn(client, workflow_id)
        await handle.cancel()
        try:
            await handle.result()
        except TurnCancelledError as cancelled:
            if cancelled.result is not None:
                TurnRenderer(console).summary(cancelled.result)
            return
        console.print("the turn had already finished")

    asyncio.run(go())


@app.command("worker")
def run_worker(
    address: Address = None, namespace: Namespace = None, config: ConfigPath = None
) -> None:
    """Run a worker for TurnWorkflow against a Temporal server (connection from the env)."""
    settings = load_settings(config)

    async def go() -> None:
        client = await connect(address, namespace, settings=settings)
        console.print(
            f"worker on task queue [bold]{settings.task_queue}[/] · agents: "
            + ", ".join(settings.agents)
        )
        async with build_worker(client, settings):
            await _until_signalled()

    asyncio.run(go())


@app.command()
def server(
    port: Annotated[int, typer.Option(help="gRPC port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Web UI port.")] = 8233,
    db: Annotated[Path | None, typer.Option(help="SQLite file (default: state dir).")] = None,
    stop: Annotated[bool, typer.Option(help="Stop the background server `run` started.")] = False,
) -> None:
    """Run the embedded Temporal dev server (with Web UI) in the foreground."""
    if stop:
        stopped = stop_background_server()
        console.print("stopped" if stopped else "no background server was running")
        return

    async def go() -> None:
        embedded = EmbeddedServer(
            db_file=db or state_dir() / "temporal.db", port=port, ui_port=ui_port
        )
        async with embedded as info:
            console.print(f"Temporal at [bold]{info.address}[/] · Web UI {info.ui_url}")
            await _until_signalled()

    asyncio.run(go())


async def _until_signalled() -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()


if __name__ == "__main__":
    main()
