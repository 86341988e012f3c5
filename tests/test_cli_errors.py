"""Ordinary mistakes at the command line: one line on stderr saying what is wrong, exit code 2,
no traceback; `turnkeep --debug` adds the traceback. Through the real CLI and test server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

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
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    """Refused before anything starts, whether the command runs the worker (--worker) or
    expects one elsewhere: the config it was given says the turn could only fail."""
    path = config(tmp_path)
    queue = json.loads(path.read_text())["task_queue"]
    agent, model, elsewhere = await asyncio.gather(
        cli(temporal, tmp_path, "run", "hi", "--worker", "--agent", "nope"),
        cli(temporal, tmp_path, "run", "hi", "--worker", "--model", "sonnet"),
        cli(temporal, tmp_path, "run", "hi", "--agent", "nope"),
    )
    assert one_error(agent) == (
        f"error: no agent 'nope' in {path} (its agents: demo); nothing was started"
    )
    assert elsewhere.stderr == agent.stderr
    assert one_error(model) == (
        "error: agent 'demo' does not let a turn use model 'sonnet' (it allows: passthrough); "
        "nothing was started (ModelNotAllowed)"
    )
    for done in (agent, model, elsewhere):
        assert done.stdout == "" and done.stderr.count("\n") == 1
    # Nothing left behind: no turn on the agents' queues.
    for agent_queue in (f"{queue}.nope", f"{queue}.demo"):
        assert [e async for e in client.list_workflows(f"TaskQueue = '{agent_queue}'")] == []


async def test_serve_refuses_an_agent_the_config_lacks(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    """Before connecting to anything: one line naming the config's agents."""
    config(tmp_path)
    done = await cli(temporal, tmp_path, "serve", "--agents", "demo,nope")
    assert one_error(done) == (
        "error: cannot serve: no agent 'nope' in the configuration (its agents: demo)"
    )
    assert done.stdout == "" and done.stderr.count("\n") == 1


async def test_run_refuses_an_empty_prompt(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    path = config(tmp_path)
    queue = json.loads(path.read_text())["task_queue"]
    empty, blank_stdin = await asyncio.gather(
        cli(temporal, tmp_path, "run", "  ", "--worker"),
        asyncio.to_thread(run_with_stdin, temporal, tmp_path, "\n\n", "run", "-", "--worker"),
    )
    assert one_error(empty).startswith(
        "error: invalid value for PROMPT: empty (there is nothing to ask)"
    )
    assert one_error(blank_stdin).startswith(
        "error: invalid value for PROMPT: stdin was empty (there is nothing to ask)"
    )
    assert [e async for e in client.list_workflows(f"TaskQueue = '{queue}.demo'")] == []


def run_with_stdin(
    temporal: ServerInfo, cwd: Path, stdin: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.address}
    return subprocess.run(
        [sys.executable, "-m", "turnkeep.cli", *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


async def test_the_command_lines_own_mistakes_are_one_line(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    """A missing argument, an option's bad value, an unknown command: one `error:` line and
    code 2, like every other mistake (not a usage box)."""
    config(tmp_path)
    missing, not_json, duration, unknown, negative = await asyncio.gather(
        cli(temporal, tmp_path, "approve", "some-turn"),
        cli(temporal, tmp_path, "approve", "some-turn", "call_1", "--arguments", "{"),
        cli(temporal, tmp_path, "gc", "--older-than", "soon"),
        cli(temporal, tmp_path, "frobnicate"),
        cli(temporal, tmp_path, "run", "hi", "--max-iterations", "-1"),
    )
    assert one_error(missing) == (
        "error: missing argument 'CALL_ID'. (see `python -m turnkeep.cli approve --help`)"
    )
    assert one_error(not_json).startswith("error: invalid value: --arguments is not JSON: ")
    assert one_error(duration).startswith(
        "error: invalid value for --older-than: 'soon' is not a duration"
    )
    assert one_error(unknown) == (
        "error: no such command 'frobnicate'. (see `python -m turnkeep.cli --help`)"
    )
    assert one_error(negative) == (
        "error: invalid value for --max-iterations: Input should be greater than or equal to 0 "
        "(see `python -m turnkeep.cli run --help`)"
    )
    for done in (missing, not_json, duration, unknown, negative):
        assert done.stderr.count("\n") == 1 and done.stdout == "", done.stderr


async def test_watch_and_cancel_an_unknown_turn(temporal: ServerInfo, tmp_path: Path) -> None:
    config(tmp_path)
    watched, cancelled = await asyncio.gather(
        cli(temporal, tmp_path, "watch", "no-such-turn"),
        cli(temporal, tmp_path, "cancel", "no-such-turn"),
    )
    for done in (watched, cancelled):
        assert done.stderr == (
            "error: no turn or session has that id (`run` and `sessions` print the ids)\n"
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
    assert done.stderr.splitlines()[-1].startswith("error: no turn or session has that id")


async def test_a_config_that_does_not_validate_says_each_problem_in_one_line(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    """One `error:` line per problem, each naming the file, the key path and the cause; not
    pydantic's report with its types and links, and never the value (it may be a key)."""
    path = tmp_path / "turnkeep.yaml"
    path.write_text(
        "agents:\n"
        "  demo:\n"
        "    model: passthrough\n"
        "    max_iterations: lots\n"
        "    budget: {tokens: -5}\n"
        "mcp:\n"
        "  servers:\n"
        "    fs: {transport: stdio, comand: sk-secret-value}\n"
        "anthropic: {api_key: [sk-secret-key]}\n",
        encoding="utf-8",
    )
    done = await cli(temporal, tmp_path, "run", "hi", "--worker")
    one_error(done)
    assert done.stdout == ""
    assert sorted(done.stderr.splitlines()) == sorted(
        [
            f"error: {path}: agents.demo.max_iterations: input should be a valid integer, "
            "unable to parse string as an integer",
            f"error: {path}: agents.demo.budget.tokens: input should be greater than 0",
            f"error: {path}: mcp.servers.fs.comand: not a setting turnkeep knows (a misspelling?)",
            f"error: {path}: anthropic.api_key: input should be a valid string",
        ]
    )
    assert "pydantic" not in done.stderr and "sk-secret" not in done.stderr


async def test_a_yaml_syntax_error_names_the_file_and_the_place(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    path = tmp_path / "turnkeep.yaml"
    path.write_text("agents:\n  demo: {model: passthrough\n", encoding="utf-8")
    done = await cli(temporal, tmp_path, "worker")
    assert done.stderr == (
        f"error: {path}, line 3, column 1: not valid YAML: expected ',' or '}}', but got "
        "'<stream end>' (while parsing a flow mapping)\n"
    )
    assert one_error(done)


@pytest.mark.slow
async def test_an_address_where_no_temporal_server_answers(tmp_path: Path) -> None:
    """Said in words with what to check, not as the SDK's Rust error chain: an address no
    process listens on, one where something else answers (plain HTTP), one that is no
    address at all."""
    config(tmp_path)
    web = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        other = f"127.0.0.1:{web.server_address[1]}"
        answered, no_port = await asyncio.gather(
            cli(ServerInfo(address=other, ui_url=None, pid=0), tmp_path, "show", "some-turn"),
            cli(ServerInfo(address="localhost:99999", ui_url=None, pid=0), tmp_path, "show", "t"),
        )
    finally:
        web.shutdown()
    assert one_error(answered).startswith(
        f"error: something answers at {other}, but not as a Temporal server ("
    )
    assert one_error(no_port) == (
        "error: 'localhost:99999' is not a server address (invalid target URL: invalid port "
        "number): give it as HOST:PORT, e.g. localhost:7233"
    )
    for done in (answered, no_port):
        assert "tonic" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
