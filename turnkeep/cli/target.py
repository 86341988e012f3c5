"""What a command that talks to Temporal works against, and how it runs: the server its options
name (``--address``, ``--namespace``; else the environment's, else the embedded one) with the
settings of its ``--config`` (``Target``), and the command's coroutine run on a client of it
(``Target.run``), with a worker in the process when the command runs turns
(``Target.run_with_worker``).

What goes wrong is raised, not reported here: ``turnkeep.cli.main`` tells every command's
error the same way (``turnkeep.cli.errors``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from temporalio.client import Client

from turnkeep.cli.process import client_and_worker
from turnkeep.config.files import load_settings
from turnkeep.config.settings import Settings
from turnkeep.devserver.embedded import ServerInfo

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """A command's ``--address``, ``--namespace`` and ``--config``, and the settings loaded
    from that config."""

    address: str | None
    namespace: str | None
    config: Path | None
    settings: Settings

    @classmethod
    def of(cls, address: str | None, namespace: str | None, config: Path | None) -> Target:
        """The command's options, with the settings loaded from ``config`` (a ``ConfigError``
        for a config that is wrong, before anything connects)."""
        return cls(address, namespace, config, load_settings(config))

    def run(self, act: Callable[[Client], Awaitable[T]]) -> T:
        """``act(client)`` run to its end in the command's event loop, on a client of the
        server (``client_for``), with no worker in this process."""
        return self.run_with_worker(lambda client, _: act(client), worker=False)

    def run_with_worker(
        self,
        act: Callable[[Client, ServerInfo | None], Awaitable[T]],
        *,
        worker: bool | None,
    ) -> T:
        """``act(client, embedded)`` run to its end in the command's event loop, with a worker
        in this process while it runs when asked (``worker``: ``--worker``), or by default on
        the embedded server (``client_and_worker``); ``embedded``: that server, when it is
        the one talked to."""

        async def go() -> T:
            async with client_and_worker(
                self.address, self.namespace, self.settings, self.config, worker=worker
            ) as (client, embedded):
                return await act(client, embedded)

        return asyncio.run(go())
