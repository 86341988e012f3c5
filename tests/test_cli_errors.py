"""Ordinary mistakes at the command line: one line on stderr saying what is wrong, exit code 2,
no traceback; `turnkeep --debug` adds the traceback. Through the real CLI and test server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import turnkeep
from turnkeep.devserver.embedded import ServerInfo

pytestmark = pytest.mark.asyncio


def config(tmp_path: Path, **agent: Any) -> Path:
    """A turnkeep.yaml with one passthrough agent and a task queue of its own."""
    path = tmp_path / "turnkeep.yaml"
    settings = {
        "task_queue": f"cli-errors-{uuid.uuid4().hex[:8]}",
        "agents": {"demo": {"model": "passthrough", **agent}},
    }
    path.write_text(json.dumps(settings), encoding="utf-8")
    return path


async def cli(temporal: ServerInfo, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(turnkeep, *args, temporal=temporal, cwd=tmp_path)


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error line a failed command printed last on stderr, after checking it failed
    without a traceback."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("error: "), done.stderr
    return last


async def test_run_with_an_unknown_agent_or_a_model_it_may_not_use(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    config(tmp_path)
    agent, model = await asyncio.gather(
        cli(temporal, tmp_path, "run", "hi", "--worker", "--agent", "nope"),
        cli(temporal, tmp_path, "run", "hi", "--worker", "--model", "sonnet"),
    )
    assert one_error(agent) == (
        "error: the turn failed: UnknownAgent: Unknown agent 'nope'. This worker's agents: demo."
    )
    assert one_error(model).startswith(
        "error: the turn failed: ModelNotAllowed: Agent 'demo' does not let a turn use model "
        "'sonnet'"
    )


async def test_watch_and_cancel_an_unknown_turn(temporal: ServerInfo, tmp_path: Path) -> None:
    config(tmp_path)
    watched, cancelled = await asyncio.gather(
        cli(temporal, tmp_path, "watch", "no-such-turn"),
        cli(temporal, tmp_path, "cancel", "no-such-turn"),
    )
    for done in (watched, cancelled):
        assert done.stderr == (
            "error: the Temporal server refused the request: workflow not found for ID: "
            "no-such-turn\n"
        )
        assert one_error(done)


async def test_a_config_naming_an_unknown_server_or_an_unimportable_hook(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    config(tmp_path, servers=["ghost"])
    ghost = await cli(temporal, tmp_path, "run", "hi", "--worker")
    assert one_error(ghost) == (
        f"error: {tmp_path}/turnkeep.yaml cannot run a worker: agent 'demo' names server(s) "
        "['ghost'] that "
        "are neither in mcp.servers nor in function_tools (known: none)"
    )
    assert ghost.stderr.count("\n") == 1

    path = config(tmp_path, hooks={"before_llm_call": ["audit"]})
    settings = json.loads(path.read_text()) | {"hooks": {"audit": "no_such_module:audit"}}
    path.write_text(json.dumps(settings), encoding="utf-8")
    for command in ("worker", "run"):
        done = await cli(temporal, tmp_path, command, *(["hi", "--worker"] * (command == "run")))
        assert one_error(done) == (
            f"error: {tmp_path}/turnkeep.yaml cannot run a worker: No module named 'no_such_module'"
        )
        assert done.stderr.count("\n") == 1 and done.stdout == ""


async def test_debug_shows_the_traceback(temporal: ServerInfo, tmp_path: Path) -> None:
    config(tmp_path)
    done = await cli(temporal, tmp_path, "--debug", "cancel", "no-such-turn")
    assert done.returncode == 2
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert "temporalio.service.RPCError: workflow not found for ID: no-such-turn" in done.stderr
    assert done.stderr.splitlines()[-1].startswith("error: the Temporal server refused")
