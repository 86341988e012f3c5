"""What the commands that keep running do in their own process: serve turns on a worker
(``run --worker``, ``worker``) and wait for Ctrl-C or SIGTERM (``worker``, ``server``,
``codec-server``)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from turnkeep.settings import Settings
from turnkeep.worker.build import build_worker
from turnkeep.worker.config import ConfigError, find_config


def in_process_worker(client: Client, settings: Settings, config: Path | None) -> Worker:
    """``build_worker``, with what the config gets wrong as a ``ConfigError``: an agent naming
    a server or hook that is not there, a hook that does not import, storage or keys the
    client does not share."""
    try:
        return build_worker(client, settings)
    except (ValueError, TypeError, ImportError, AttributeError) as err:
        where = find_config(config) or "the configuration"
        raise ConfigError(f"{where} cannot run a worker: {err}") from err


async def until_signalled() -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
