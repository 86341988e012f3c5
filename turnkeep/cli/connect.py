"""The client a command talks to Temporal through: the server the options or the environment
name, else the embedded dev server, started in the background (with a codec server beside it
when payloads are encrypted) so turns and the Web UI outlive the command."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client

from turnkeep.cli.console import console
from turnkeep.client.connection import address_configured, connect
from turnkeep.config.settings import Settings
from turnkeep.devserver.codec import background_codec_server_url, ensure_background_codec_server
from turnkeep.devserver.embedded import ServerInfo, ensure_background_server


def uses_embedded(address: str | None) -> bool:
    """Whether a command talks to the embedded server: no address given, none configured."""
    return address is None and not address_configured()


async def client_for(
    address: str | None,
    namespace: str | None,
    settings: Settings,
    *,
    config_file: Path | None = None,
) -> tuple[Client, ServerInfo | None]:
    """A client for the given server, or for the embedded one when none is configured. The
    settings give it the workers' payload storage and encryption keys, so it can read what they
    write. With encryption on, the embedded server's Web UI decodes through a codec server,
    which is started from ``config_file`` (the file the settings came from) when it is given."""
    if uses_embedded(address):
        info = await ensure_background_server(codec_endpoint=background_codec_server_url(settings))
        console.print(f"[dim]embedded Temporal server at {info.address} · Web UI {info.ui_url}[/]")
        await _background_codec_server(settings, config_file, info)
        return await connect(info.address, info.namespace, settings=settings), info
    return await connect(address, namespace, settings=settings), None


async def _background_codec_server(
    settings: Settings, config_file: Path | None, info: ServerInfo
) -> None:
    if settings.encryption is None:
        return
    wanted = background_codec_server_url(settings)
    if wanted is None:
        console.print(
            "[dim]payloads are encrypted; set encryption.codec_server.token to read them in "
            "the Web UI[/]"
        )
        return
    if info.codec_endpoint != wanted:
        console.print(
            f"[yellow]the background server's Web UI decodes with "
            f"{info.codec_endpoint or 'no codec server'}, not {wanted}: restart it "
            "(turnkeep server --stop) to change that[/]"
        )
    if config_file is not None:
        url = await ensure_background_codec_server(settings, config_file, ui_origin=info.ui_url)
        console.print(f"[dim]codec server {url} · sign in at {url}/login to decrypt in the UI[/]")
