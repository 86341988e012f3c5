"""What the commands that keep running do in their own process: serve turns on a worker
(``run --worker``, ``worker``) and wait for Ctrl-C or SIGTERM (``worker``, ``server``,
``codec-server``)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client

from turnkeep.cli.connect import client_for
from turnkeep.config.files import ConfigError, find_config
from turnkeep.config.settings import Settings, StreamingSettings
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.worker.build import TurnkeepWorkers, build_workers


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
    if not (worker if worker is not None else embedded is not None):
        yield client, embedded
        return
    # This process both runs the turn and watches it: its model calls stream to it on
    # loopback unless the config says otherwise.
    if settings.streaming is None:
        settings = with_streaming(settings, "127.0.0.1:0")
    async with in_process_worker(client, settings, config):
        yield client, embedded
