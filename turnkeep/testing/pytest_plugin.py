"""pytest fixtures for testing agents on turnkeep: enable them with
``pytest_plugins = ["turnkeep.testing.pytest_plugin"]`` in your top ``conftest.py`` (or
``-p turnkeep.testing.pytest_plugin``). They need pytest-asyncio.

- ``turnkeep_server`` (session): an embedded Temporal dev server, in memory and headless, one
  per test process (so one per pytest-xdist worker); its ``ServerInfo``.
- ``turnkeep_client``: a client connected to it, on the test's event loop.
- ``fake_model``: a ``FakeModel`` with no scripts and no recorded requests, over one fake
  model API per test process.
- ``turnkeep_worker``: ``turnkeep_worker(settings, agents=[...], **options)`` is an async
  context manager running a worker on a task queue of its own, whose providers point at
  ``fake_model`` (``fake=`` another, or None for none), and yields its ``Harness``
  (``harness``'s options).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import pytest
import pytest_asyncio
from temporalio.client import Client

from turnkeep.client.connection import connect
from turnkeep.config.settings import Settings
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.testing.environment import Harness, harness
from turnkeep.testing.fake_api import FakeModelApi
from turnkeep.testing.fake_model import FakeModel


class WorkerFactory(Protocol):
    def __call__(
        self, settings: Settings | None = None, **options: Any
    ) -> AbstractAsyncContextManager[Harness]: ...


# The server outlives every test, so it runs on the session's event loop; what it yields is
# plain data (an address), which tests on any loop can use.
@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def turnkeep_server() -> AsyncIterator[ServerInfo]:
    async with EmbeddedServer(ui=False) as info:
        yield info


# A client per test, connected on the test's own event loop: a test on a loop of its own (the
# default of pytest-asyncio) cannot share one made on another.
@pytest_asyncio.fixture
async def turnkeep_client(turnkeep_server: ServerInfo) -> Client:
    return await connect(turnkeep_server.address, turnkeep_server.namespace)


# The fake API runs on a thread of its own, so it serves tests on any event loop.
@pytest.fixture(scope="session")
def turnkeep_fake_api() -> Iterator[FakeModelApi]:
    with FakeModelApi() as api:
        yield api


@pytest.fixture
def fake_model(turnkeep_fake_api: FakeModelApi) -> FakeModel:
    turnkeep_fake_api.reset()
    return FakeModel(turnkeep_fake_api)


@pytest.fixture
def turnkeep_worker(turnkeep_client: Client, fake_model: FakeModel) -> WorkerFactory:
    def make(
        settings: Settings | None = None, **options: Any
    ) -> AbstractAsyncContextManager[Harness]:
        options.setdefault("fake", fake_model)
        return harness(turnkeep_client, settings, **options)

    return make
