"""The servers beside Temporal's: ``server`` runs the embedded dev server with its Web UI (or
stops the background one), ``codec-server`` serves the remote codec that decrypts payloads
for the Web UI and the ``temporal`` CLI."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Annotated

import typer
from pydantic import TypeAdapter, ValidationError

from turnkeep.cli.console import console
from turnkeep.cli.options import ConfigPath
from turnkeep.cli.process import until_signalled
from turnkeep.config.files import ConfigError, load_settings
from turnkeep.config.paths import state_dir
from turnkeep.config.settings import Origin
from turnkeep.devserver.codec import stop_background_codec_server
from turnkeep.devserver.embedded import HOST as EMBEDDED_HOST
from turnkeep.devserver.embedded import EmbeddedServer, stop_background_server
from turnkeep.payloads.codec_server import CodecServer

app = typer.Typer()


@app.command()
def server(
    port: Annotated[int, typer.Option(help="gRPC port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Web UI port.")] = 8233,
    db: Annotated[Path | None, typer.Option(help="SQLite file (default: state dir).")] = None,
    stop: Annotated[bool, typer.Option(help="Stop the background server `run` started.")] = False,
    config: ConfigPath = None,
) -> None:
    """Run the embedded Temporal dev server (with Web UI) in the foreground. With encryption
    in the config, a codec server runs beside it and the Web UI decrypts through it."""
    if stop:
        stopped = stop_background_server()
        stop_background_codec_server()
        console.print("stopped" if stopped else "no background server was running")
        return
    settings = load_settings(config)

    async def go() -> None:
        async with contextlib.AsyncExitStack() as stack:
            codec_url = None
            if settings.encryption is not None and settings.encryption.codec_server.token:
                ui_origin = f"http://{EMBEDDED_HOST}:{ui_port}"
                codec = CodecServer(settings.encryption, origins=[ui_origin])
                codec_url = await stack.enter_async_context(codec)
            embedded = EmbeddedServer(
                db_file=db or state_dir() / "temporal.db",
                port=port,
                ui_port=ui_port,
                codec_endpoint=codec_url,
            )
            info = await stack.enter_async_context(embedded)
            console.print(f"Temporal at [bold]{info.address}[/] · Web UI {info.ui_url}")
            if codec_url:
                console.print(
                    f"codec server at [bold]{codec_url}[/] · sign in at {codec_url}/login, "
                    "then turn on the UI's cross-origin credentials "
                    "(see docs/operations/encryption.md)"
                )
            elif settings.encryption is not None:
                console.print(
                    "payloads are encrypted; set encryption.codec_server.token to read them in "
                    "the Web UI"
                )
            await until_signalled()

    asyncio.run(go())


@app.command("codec-server")
def codec_server(
    config: ConfigPath = None,
    host: Annotated[
        str | None, typer.Option(help="Listen address (default: encryption.codec_server.host).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (default: encryption.codec_server.port).")
    ] = None,
    origin: Annotated[
        list[str] | None,
        typer.Option(
            help="A Web UI origin (scheme://host:port) whose pages may call it; repeatable, "
            "added to encryption.codec_server.origins."
        ),
    ] = None,
) -> None:
    """Serve Temporal's remote codec protocol, so the Web UI and `temporal workflow show
    --codec-endpoint URL --codec-auth "Bearer TOKEN"` show encrypted payloads decrypted.
    Every request needs encryption.codec_server.token; browsers sign in at URL/login."""
    settings = load_settings(config)
    if settings.encryption is None:
        raise ConfigError("there is no `encryption` in the config, so there is nothing to decode")
    encryption = settings.encryption
    origins = [_origin_option(value) for value in origin or []]

    async def go() -> None:
        async with CodecServer(encryption, host=host, port=port, origins=origins) as server:
            console.print(f"codec server at [bold]{server}[/] · browsers sign in at {server}/login")
            await until_signalled()

    asyncio.run(go())


def _origin_option(value: str) -> str:
    try:
        return TypeAdapter(Origin).validate_python(value)
    except ValidationError as err:
        raise typer.BadParameter(
            "; ".join(e["msg"] for e in err.errors()), param_hint="--origin"
        ) from None
