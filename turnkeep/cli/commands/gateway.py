"""``turnkeep gateway``: the HTTP gateway (``turnkeep.doors.gateway``) served until SIGINT or
SIGTERM, over the client ``run`` uses, with a worker in the process when asked (``--worker``)
or on the embedded server."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import typer
from rich.markup import escape
from temporalio.client import Client

from turnkeep.cli.console import console
from turnkeep.cli.options import Address, ConfigPath, InProcessWorker, Namespace, extended
from turnkeep.cli.process import until_signalled
from turnkeep.cli.target import Target
from turnkeep.config.files import ConfigError
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.doors.gateway import gateway_app
from turnkeep.doors.gateway.auth import KeyRing, KeysFileError
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.support.loopback import is_loopback

app = typer.Typer()


def _host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise typer.BadParameter("must be HOST:PORT, e.g. 127.0.0.1:8080", param_hint="--listen")
    return host.strip("[]") or "0.0.0.0", int(port)


@app.command()
def gateway(
    listen: Annotated[
        str | None,
        typer.Option(help="HOST:PORT to serve on (default: gateway.listen, 127.0.0.1:8080)."),
    ] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: InProcessWorker = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Accept requests without a key (every agent, deciding too): loopback only.",
        ),
    ] = False,
    a2a: Annotated[
        bool | None,
        typer.Option(
            "--a2a/--no-a2a",
            help="Serve each agent over A2A at /a2a/<agent>/, behind the same keys "
            "(default: when a2a-sdk is installed).",
        ),
    ] = None,
    mcp: Annotated[
        bool,
        typer.Option(
            "--mcp/--no-mcp",
            help="Serve the agents as MCP tools at /mcp (streamable HTTP), each key its own "
            "agents (gateway.mcp_scope: what a call is).",
        ),
    ] = True,
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help="Host names it answers for besides loopback ones (comma-separated, name or "
            "name:port), added to gateway.allowed_hosts.",
            show_default=False,
        ),
    ] = None,
    allowed_origins: Annotated[
        str | None,
        typer.Option(
            help="Web origins whose pages may send it requests (comma-separated, "
            "scheme://host:port), added to gateway.allowed_origins.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the config's agents over HTTP: turns, sessions, approvals and their live events
    (server-sent events), with an OpenAPI document at /openapi.json (docs/serving/http.md);
    over A2A at /a2a/<agent>/ and MCP at /mcp too. Every request needs a bearer key from
    gateway.keys unless --no-auth on loopback."""
    target = Target.of(address, namespace, config)
    block = extended(target.settings.gateway, allowed_hosts, allowed_origins)
    settings = target.settings.model_copy(update={"gateway": block})
    host, port = _host_port(listen or settings.gateway.listen)
    if no_auth and not is_loopback(host):
        raise typer.BadParameter(
            f"--no-auth serves loopback only, not {host}: give keys in gateway.keys",
            param_hint="--no-auth",
        )
    if not no_auth:
        try:
            keys = KeyRing.from_settings(settings)
        except (ValueError, KeysFileError) as err:
            raise ConfigError(str(err)) from None
        if not keys.keys:
            where = settings.config_file or "the configuration"
            raise ConfigError(
                f"{where} gives the gateway no API keys: add some under gateway.keys (or "
                "gateway.keys_file), or serve loopback only with --no-auth"
            )

    async def go(client: Client, embedded: ServerInfo | None) -> None:
        try:
            app = gateway_app(
                client,
                settings,
                keys=None if no_auth else keys,
                auth=not no_auth,
                web_ui=settings.gateway.web_ui or (embedded.ui_url if embedded else None),
                a2a=a2a,
                mcp=mcp,
            )
        except (ValueError, KeysFileError, ImportError) as err:
            raise ConfigError(str(err)) from None
        server = AsgiServer(app, name="gateway")
        try:
            sock = bind(host, port)
        except OSError as err:
            raise ConfigError(
                f"the gateway cannot listen on {host}:{port}: {err.strerror}"
            ) from None
        # The app's lifespan runs the MCP door (its session managers), then closes it.
        async with app.router.lifespan_context(app):
            bound = await server.start(sock)
            auth = "no authentication (loopback)" if no_auth else "bearer keys"
            doors = " · MCP at /mcp" if mcp else ""
            console.print(
                f"gateway on [bold]{escape(http_url(host, bound))}[/] · agents: "
                f"{escape(', '.join(settings.agents) or 'none')} · {auth}{doors}"
            )
            try:
                await until_signalled()
            finally:
                await app.state.gateway.hub.aclose()
                await server.stop()

    replace(target, settings=settings).run_with_worker(go, worker=worker)
