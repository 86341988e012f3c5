"""``serve``: the config's agents as an MCP server (``turnkeep.doors.mcp_server``), over stdio
or streamable HTTP, as ``fast-agent serve`` serves its agents."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from enum import StrEnum
from typing import Annotated, Any

import typer
from temporalio.client import Client

from turnkeep.cli.console import console
from turnkeep.cli.options import Address, ConfigPath, InProcessWorker, Namespace, extended
from turnkeep.cli.process import runs_worker
from turnkeep.cli.target import Target
from turnkeep.config.files import ConfigError
from turnkeep.config.settings import ServeSettings
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.doors.mcp_server import McpDoor
from turnkeep.errors import known
from turnkeep.support.loopback import is_loopback

app = typer.Typer()


class Transport(StrEnum):
    http = "http"
    stdio = "stdio"


class InstanceScopeOption(StrEnum):
    shared = "shared"
    connection = "connection"
    request = "request"


@app.command()
def serve(
    transport: Annotated[
        Transport,
        typer.Option(case_sensitive=False, help="stdio (stdout carries JSON-RPC only) or http."),
    ] = Transport.http,
    agents: Annotated[
        str | None,
        typer.Option(
            help="Serve only these agents of the config (comma-separated).", show_default=False
        ),
    ] = None,
    instance_scope: Annotated[
        InstanceScopeOption,
        typer.Option(
            case_sensitive=False,
            help="shared: one session per agent for every client; connection: one per MCP "
            "connection; request: each call a turn of its own, without history.",
        ),
    ] = InstanceScopeOption.shared,
    host: Annotated[str, typer.Option(help="Address to listen on (http).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (http; 0: a free one).")] = 8000,
    name: Annotated[str, typer.Option(help="The MCP server's name.")] = "turnkeep",
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help="Host names it answers for besides loopback ones (http; comma-separated, "
            "name or name:port), added to serve.allowed_hosts.",
            show_default=False,
        ),
    ] = None,
    allowed_origins: Annotated[
        str | None,
        typer.Option(
            help="Web origins whose pages may call it (http; comma-separated, "
            "scheme://host:port), added to serve.allowed_origins.",
            show_default=False,
        ),
    ] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: InProcessWorker = None,
    drain: Annotated[
        float,
        typer.Option(
            help="With a worker in this process: on leaving (stdin closed, or a first "
            "SIGINT/SIGTERM), how many seconds the turns this server started get to finish; "
            "another signal ends the wait."
        ),
    ] = 600.0,
) -> None:
    """Serve the config's agents as MCP tools (each call a durable turn), plus
    turnkeep_start/status/cancel/pending/decide for turns that outlive a call. Over stdio
    every other line goes to stderr; over http the server listens on HOST:PORT/mcp."""
    if transport is Transport.stdio:
        console.to_stderr()  # stdout is the MCP client's: JSON-RPC only
    target = Target.of(address, namespace, config)
    settings = target.settings
    serving = extended(settings.serve, allowed_hosts, allowed_origins)
    wanted = agents.split(",") if agents is not None else None
    in_process = runs_worker(address, worker)
    if port < 0 or port > 65535:
        raise typer.BadParameter("must be 0..65535", param_hint="--port")
    missing = [a for a in wanted or () if a not in settings.agents]
    if missing:  # before any server starts: nothing to serve
        raise ConfigError(
            f"cannot serve: no agent {missing[0]!r} in the configuration "
            f"(its agents: {known(settings.agents)})"
        )

    async def go(client: Client, _: ServerInfo | None) -> None:
        try:
            door = McpDoor(client, settings, agents=wanted, scope=instance_scope.value, name=name)
        except ValueError as err:
            raise ConfigError(f"cannot serve: {err}") from None
        signals = _Signals()
        if transport is Transport.stdio:
            console.print(f"[dim]serving {', '.join(door.agents)} over MCP on stdio[/]")
            # Until the client closes stdin (or stops the process with a signal).
            await signals.until(door.server.run_stdio_async(show_banner=False))
        else:
            await _serve_http(door, host, port, signals, serving)
        if in_process:
            await signals.until(_drain(door, drain))

    target.run_with_worker(go, worker=worker)


class _Signals:
    """SIGINT/SIGTERM, counted: each ends what ``until`` runs at the time (serving, then the
    drain), so a second Ctrl-C stops a drain the first began."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._event.set)

    async def until(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` until it ends or a signal comes; its failure is raised."""
        self._event.clear()
        task = asyncio.ensure_future(work)
        signalled = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({task, signalled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (task, signalled):
                pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if task.done() and not task.cancelled():
            task.result()


async def _serve_http(
    door: McpDoor, host: str, port: int, signals: _Signals, serving: ServeSettings
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        try:
            url = await stack.enter_async_context(
                door.serve_http(
                    host,
                    port,
                    allowed_hosts=serving.allowed_hosts,
                    allowed_origins=serving.allowed_origins,
                )
            )
        except OSError as err:
            raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
        console.print(f"serving {', '.join(door.agents)} over MCP at {url}")
        if not is_loopback(host):
            console.print(
                f"[yellow]warning: listening on {host} lets any host that reaches it start "
                "turns; put an authenticating proxy in front (docs: Serving agents over MCP)[/]"
            )
            if not serving.allowed_hosts:
                console.print(
                    "[yellow]warning: no serve.allowed_hosts (--allowed-hosts): requests are "
                    "answered whatever host name they give, which DNS rebinding can abuse[/]"
                )
        await signals.until(asyncio.Event().wait())


async def _drain(door: McpDoor, seconds: float) -> None:
    """The worker stops with this process: give the turns this server started time to end."""
    running = await door.drain(0)
    if not running:
        return
    console.print(f"waiting up to {seconds:.0f}s for {running} running turn(s) to finish…")
    left = await door.drain(seconds)
    if left:
        console.print(
            f"[yellow]{left} turn(s) still running: they go on once a worker with their agent "
            "polls again[/]"
        )
