"""What the command line prints, as a user meets it through the real CLI and the test server:
`--json` writes the JSON alone to stdout (on the embedded server too) with the turn's id, a
run without a config names the built-in agent, `--help` uses the README's names and wraps to
the terminal, lines are not wrapped outside a terminal, counts take their plural, a turn no
worker polls for is said to wait, a cancel shows turnkeep's words only, a cancelled call is no
warning, `chat` tells a failed turn and how to resume, and `sessions` lists one row per
session and closes one."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from temporalio.activity import logger as temporal_activity_logger
from temporalio.client import Client
from temporalio.exceptions import CancelledError

from tests.conftest import HarnessFactory
from tests.mcp_servers.launch import STDIO_SCRIPT
from turnkeep.cli.main import _InTurnkeepsWords
from turnkeep.client.sessions import SessionHandle, get_session, open_session
from turnkeep.config.files import load_settings
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.worker.build import build_workers

pytestmark = pytest.mark.asyncio

# Generous: each step starts a CLI process (and often a worker) on a loaded 2-core machine.
WAIT = 120


def write_config(tmp_path: Path, **agents: Any) -> str:
    """A turnkeep.yaml with the test MCP server and ``agents`` (default: one passthrough agent
    `demo`) on a task queue of its own; returns that queue."""
    queue = f"cli-out-{uuid.uuid4().hex[:8]}"
    server = {"command": sys.executable, "args": [str(STDIO_SCRIPT)]}
    config = {
        "task_queue": queue,
        "mcp": {"servers": {"srv": server}},
        "agents": agents or {"demo": {"model": "passthrough", "servers": ["srv"]}},
    }
    (tmp_path / "turnkeep.yaml").write_text(json.dumps(config), encoding="utf-8")
    return queue


def cli_env(temporal: ServerInfo | None, **extra: str) -> dict[str, str]:
    """The environment a user's shell gives the CLI: no COLUMNS (a pipe is 80 columns wide to
    a program that asks), and the test server's address unless ``temporal`` is None."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TEMPORAL_ADDRESS")}
    if temporal is not None:
        env["TEMPORAL_ADDRESS"] = temporal.address
    return {**env, **extra}


def run_cli(
    *args: str, cwd: Path, env: Mapping[str, str], stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnkeep.cli", *args],
        cwd=cwd,
        env=dict(env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


async def cli(*args: str, cwd: Path, env: Mapping[str, str], stdin: str = "") -> Any:
    return await asyncio.to_thread(run_cli, *args, cwd=cwd, env=env, stdin=stdin)


def embedded_state(tmp_path: Path, temporal: ServerInfo) -> Path:
    """A state directory whose background-server record names the test server, as `turnkeep
    run` leaves it after starting the embedded server: commands run without an address reuse
    it as the embedded server (and print its banner)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    record = {
        "pid": temporal.pid,
        "address": temporal.address,
        "ui_url": "http://127.0.0.1:1",  # the test server has no UI; the banner names one
        "namespace": temporal.namespace,
    }
    (state / "server.json").write_text(json.dumps(record), encoding="utf-8")
    return state


async def test_json_mode_writes_only_json_to_stdout_on_the_embedded_server(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    write_config(tmp_path)
    env = cli_env(None, TURNKEEP_STATE_DIR=str(embedded_state(tmp_path, temporal)))
    turn_id = f"json-{uuid.uuid4().hex[:8]}"
    ran = await cli("run", "hello json", "--json", "--id", turn_id, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["turn_id"] == turn_id  # a script follows the turn up from stdout alone
    assert result["final"]["content"][0]["text"] == "hello json"
    # Everything else went to stderr: the embedded server's banner and the streamed turn.
    assert "embedded Temporal server at " + temporal.address in ran.stderr
    assert "assistant › hello json" in ran.stderr and f"turn {turn_id}" in ran.stderr

    shown, pending = await asyncio.gather(
        cli("show", turn_id, "--json", cwd=tmp_path, env=env),
        cli("pending", "--json", cwd=tmp_path, env=env),
    )
    for done in (shown, pending):
        assert done.returncode == 0, done.stderr
        assert "embedded Temporal server at" in done.stderr
    assert json.loads(shown.stdout)["workflow_id"] == turn_id
    assert isinstance(json.loads(pending.stdout), list)


async def test_without_a_config_run_says_which_agent_runs(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    """No config in the directory: one line on stderr says so and names the built-in agent
    and its model; stdout still carries the JSON alone, with the turn's id."""
    project = tmp_path / "project"
    project.mkdir()
    env = cli_env(None, TURNKEEP_STATE_DIR=str(embedded_state(tmp_path, temporal)))
    for key in ("TURNKEEP_CONFIG", "FAST_AGENT_HOME", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        env.pop(key, None)
    turn_id = f"no-config-{uuid.uuid4().hex[:8]}"
    ran = await cli("run", "echo me", "--json", "--id", turn_id, cwd=project, env=env)
    assert ran.returncode == 0, ran.stderr
    note = (
        "no config found (no turnkeep.yaml here, nor fast-agent's): running the built-in "
        "agent 'default' on model passthrough, which echoes the prompt back"
    )
    assert ran.stderr.splitlines().count(note) == 1, ran.stderr
    result = json.loads(ran.stdout)
    assert result["turn_id"] == turn_id
    assert result["final"]["content"][0]["text"] == "echo me"

    # With a config, nothing of the kind.
    write_config(project)
    configured = await cli("run", "hi", "--json", cwd=project, env=env)
    assert configured.returncode == 0, configured.stderr
    assert "no config found" not in configured.stderr
    assert json.loads(configured.stdout)["turn_id"].strip()


@pytest.mark.slow
async def test_help_uses_the_readmes_names_and_wraps_to_the_terminal(tmp_path: Path) -> None:
    """`--help` names a turn's id TURN_ID as the README does, and the command listing wraps
    each command's line to the terminal's width, not at the docstring's own line breaks."""
    wide, show = await asyncio.gather(
        cli("--help", cwd=tmp_path, env=cli_env(None, COLUMNS="250")),
        cli("show", "--help", cwd=tmp_path, env=cli_env(None, COLUMNS="100")),
    )
    assert wide.returncode == 0 and show.returncode == 0
    run_rows = [line for line in wide.stdout.splitlines() if "│ run " in line]
    assert len(run_rows) == 1, wide.stdout
    assert "A turn that could only fail (an empty prompt, an agent the config lacks" in run_rows[0]
    assert "TURN_ID" in show.stdout and "workflow_id" not in show.stdout


async def test_no_wrapping_outside_a_terminal_and_plurals(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    write_config(tmp_path)
    env = cli_env(None, TURNKEEP_STATE_DIR=str(embedded_state(tmp_path, temporal)))
    # A workflow id long enough for its Web UI link to pass 80 columns.
    turn_id = "a-turn-with-a-long-name-" + uuid.uuid4().hex
    ran = await cli("run", "hi", "--id", turn_id, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    link = f"http://127.0.0.1:1/namespaces/default/workflows/{turn_id}"
    assert f"Web UI {link}\n" in ran.stdout
    assert len(f"Web UI {link}") > 80
    # One model call: "1 call", not "1 calls".
    one_call = r"usage: passthrough: \d+ in / \d+ out \(1 call, \$0\.0000\)\n"
    assert re.search(one_call, ran.stdout), ran.stdout


async def test_run_says_no_worker_polls_its_queue_and_keeps_waiting(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    queue = write_config(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turnkeep.cli",
        "run",
        "anyone there?",
        cwd=tmp_path,
        env=cli_env(temporal),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        said = ""
        async with asyncio.timeout(WAIT):
            while "no worker is polling" not in said:
                line = await proc.stdout.readline()
                assert line, f"run ended without saying no worker polls: {said}"
                said += line.decode()
        assert f"no worker is polling task queue {queue}.demo on {temporal.address}" in said
        assert "still waiting" in said
        await asyncio.sleep(1)
        assert proc.returncode is None  # it keeps waiting
        # Once a worker polls the queue, the turn runs and the command ends as usual.
        settings = load_settings(tmp_path / "turnkeep.yaml")
        async with build_workers(client, settings):
            out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert "assistant › anyone there?" in out.decode()


async def test_cancel_shows_turnkeeps_words_only(temporal: ServerInfo, tmp_path: Path) -> None:
    write_config(tmp_path)
    turn_id = f"cancelled-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turnkeep.cli",
        "run",
        '***CALL_TOOL srv__slow {"seconds": 120}',
        "--worker",
        "--id",
        turn_id,
        cwd=tmp_path,
        env=cli_env(temporal),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        output = ""
        async with asyncio.timeout(WAIT):
            while "srv__slow" not in output:  # the tool runs
                line = await proc.stdout.readline()
                assert line, f"run ended early: {output}"
                output += line.decode()
        cancelled = await cli("cancel", turn_id, cwd=tmp_path, env=cli_env(temporal))
        rest, errors = await asyncio.wait_for(proc.communicate(), WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert cancelled.returncode == 0, cancelled.stderr
    assert "history repair: appended_interrupted_tool_result" in cancelled.stdout
    assert "stop reason: cancelled" in output + rest.decode()
    # The activity cancelled under the tool completes after its turn has: the SDK's core says
    # so at warning level, which a person need not read.
    for said in (errors.decode(), cancelled.stderr):
        assert "sdk_core" not in said and "\x1b[" not in said and "WARN" not in said, said


async def test_a_cancelled_activity_is_not_a_warning_to_a_person() -> None:
    """The SDK's line for an activity that ended cancelled without the server asking (the
    command's own worker stopping under it) is dropped for a person; another activity's
    failure is still told, in turnkeep's words."""

    def record(failure: BaseException) -> logging.LogRecord:
        try:
            raise failure
        except BaseException:
            line = logging.LogRecord(
                temporal_activity_logger.name,
                logging.WARNING,
                __file__,
                1,
                "Completing activity as failed",
                None,
                sys.exc_info(),
            )
        line.temporal_activity = {"activity_type": "call_tool", "attempt": 1}
        return line

    words = _InTurnkeepsWords()
    assert not words.filter(record(asyncio.CancelledError("Activity cancelled")))
    assert not words.filter(record(CancelledError("Activity cancelled")))
    failed = record(ValueError("boom"))
    assert words.filter(failed)
    assert failed.getMessage() == "call_tool failed (attempt 1), to be retried: ValueError: boom"


async def test_chat_tells_a_failed_turn_and_how_to_resume(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    broken = {"command": str(tmp_path / "no-such-server")}
    queue = write_config(tmp_path, broken={"model": "passthrough", "servers": ["gone"]})
    config = json.loads((tmp_path / "turnkeep.yaml").read_text())
    config["mcp"]["servers"]["gone"] = broken
    (tmp_path / "turnkeep.yaml").write_text(json.dumps(config), encoding="utf-8")
    env = cli_env(temporal)

    done = await cli("chat", "--agent", "broken", "--worker", cwd=tmp_path, env=env, stdin="hi\n")
    assert done.returncode == 2, done.stdout + done.stderr
    [session_id] = re.findall(r"^session (session-broken-\S+)$", done.stdout, re.M)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: the turn failed: ServerUnavailable: MCP server 'gone' (stdio) could not be "
        "started: its command could not be run: No such file or directory"
    ]
    assert "Completing activity" not in done.stderr and "{'" not in done.stderr
    assert done.stdout.rstrip().endswith(
        f"resume it with `turnkeep chat --session {session_id}`, end it with "
        f"`turnkeep sessions close {session_id}`"
    )
    await get_session(client, session_id).handle.terminate()

    # An agent the config lacks: refused before a session starts.
    nosuch = await cli("chat", "--agent", "nosuch", "--worker", cwd=tmp_path, env=env, stdin="hi\n")
    assert nosuch.returncode == 2 and nosuch.stdout == ""
    assert nosuch.stderr == (
        f"error: no agent 'nosuch' in {tmp_path / 'turnkeep.yaml'} (its agents: broken); "
        "nothing was started\n"
    )
    started = [e async for e in client.list_workflows(f"TaskQueue = '{queue}.nosuch'")]
    assert started == []


async def open_on(client: Client, task_queue: str, **kwargs: Any) -> SessionHandle:
    return await open_session(client, agent="test", task_queue=task_queue, **kwargs)


async def talk(session: SessionHandle, *lines: str) -> None:
    for line in lines:
        sent = await session.send(line)
        async for _ in session.messages(until_turn=sent.turn):
            pass


async def test_sessions_lists_one_row_per_session_and_closes_one(
    harness: HarnessFactory, temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    env = cli_env(temporal)
    async with harness(agents={"test": {"model": "passthrough"}}) as h:
        # One turn per run: five turns continue as new four times, yet make one session.
        older = await open_on(client, h.task_queue, turns_per_run=1)
        await talk(older, *(f"m{n}" for n in range(5)))
        newer = await open_on(client, h.task_queue)
        await talk(newer, "hello")

        listed = await cli("sessions", "--limit", "1000", cwd=tmp_path, env=env)
        assert listed.returncode == 0, listed.stderr
        rows = {
            sid: [line for line in listed.stdout.splitlines() if line.startswith(sid + " ")]
            for sid in (older.session_id, newer.session_id)
        }
        # The session started with its first run, four runs ago.
        current = await older.handle.describe()
        first_run = current.raw_description.workflow_execution_info.first_run_id
        assert first_run != current.run_id
        first = client.get_workflow_handle(older.session_id, run_id=first_run)
        first_start = (await first.describe()).start_time
        [row] = rows[older.session_id]
        assert re.fullmatch(
            rf"{older.session_id} · agent test · open · 5 turns · [\d,]+ tokens · started "
            rf"{first_start:%Y-%m-%d %H:%M:%S} UTC",
            row,
        ), row
        assert rows[newer.session_id][0].startswith(
            f"{newer.session_id} · agent test · open · 1 turn · "
        )
        # Newest first.
        assert listed.stdout.index(newer.session_id) < listed.stdout.index(older.session_id)

        # A session is not a turn, nor a turn a session: each verb says which to use.
        cancel, close_turn = await asyncio.gather(
            cli("cancel", older.session_id, cwd=tmp_path, env=env),
            cli("sessions", "close", f"{older.session_id}/turn-1", cwd=tmp_path, env=env),
        )
        assert (cancel.returncode, close_turn.returncode) == (2, 2)
        assert cancel.stderr.startswith(
            f"error: invalid value for TURN_ID: '{older.session_id}' is a SessionWorkflow, "
            "not a turn (`turnkeep sessions close` ends one)"
        )
        assert close_turn.stderr.startswith(
            f"error: invalid value for SESSION_ID: '{older.session_id}/turn-1' is a "
            "TurnWorkflow, not a session"
        )

        closed = await cli("sessions", "close", older.session_id, cwd=tmp_path, env=env)
        assert closed.returncode == 0, closed.stderr
        assert closed.stdout == f"closed session {older.session_id} · 5 turns\n"
        assert (await older.result()).turns == 5
        again = await cli("sessions", "close", older.session_id, cwd=tmp_path, env=env)
        assert again.stdout == f"session {older.session_id} was already closed\n"
        listed = await cli("sessions", "--limit", "1000", cwd=tmp_path, env=env)
        [row] = [line for line in listed.stdout.splitlines() if older.session_id in line]
        assert " · closed · 5 turns · " in row
        await newer.close()
