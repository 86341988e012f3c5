"""The client side: streaming a running turn, resuming from an index, cancelling with repair,
and the `turnkeep` CLI end to end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from tests.conftest import HarnessFactory, turnkeep, write_script
from tests.mcp_servers.launch import STDIO_SCRIPT
from turnkeep.client.turns import start_turn
from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.turn_io import RollbackState, TurnCancelledError, TurnInput
from turnkeep.devserver.embedded import ServerInfo, free_port
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio

gate = asyncio.Event()


async def wait_for_gate(name: str) -> str:
    """Blocks until the test opens the gate."""
    await gate.wait()
    return f"{name} passed"


def quick(name: str) -> str:
    """Returns at once."""
    return f"{name} done"


TOOLS = {"local": [wait_for_gate, quick]}
DEMO_TOOLS = Path(__file__).resolve().parents[1] / "examples" / "demo_tools.py"


def scripted(tmp_path: Path, *entries: Any) -> dict[str, Any]:
    script = write_script(tmp_path / "script.json", *entries)
    agent = {"model": "playback", "playback": str(script), "servers": ["local"]}
    return {"agents": {"test": agent}}


def call(cid: str, tool: str, name: str) -> tuple[str, dict[str, Any]]:
    return cid, {"name": f"local__{tool}", "arguments": {"name": name}}


async def test_messages_stream_while_the_turn_runs_and_resume_from_an_index(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    gate.clear()
    config = scripted(
        tmp_path, {"tool_calls": dict([call("c1", "wait_for_gate", "g")])}, "all done"
    )
    async with harness(TOOLS, **config) as h:
        turn = await h.start("go")
        stream = turn.messages(include_tool_results=True)
        first = await anext(stream)
        # The tool call arrives while the tool is still blocked: the turn is mid-flight.
        assert first.stop_reason == StopReason.TOOL_USE
        assert (await turn.handle.describe()).status == WorkflowExecutionStatus.RUNNING

        # A second watcher resuming from index 1 (the assistant's call) sees the same message.
        resumed = turn.messages(1)
        assert (await anext(resumed)).tool_calls == first.tool_calls

        gate.set()
        rest = [m async for m in stream]
        assert [m.role for m in rest] == ["user", "assistant"]
        assert rest[0].tool_results and rest[0].tool_results["c1"].text == "g passed"
        assert rest[1].text == "all done"
        assert [m.text async for m in resumed] == ["all done"]

        # After the turn has ended the iterator still works, from any index.
        result = await turn.result()
        after = [m async for m in turn.messages(2, include_tool_results=True)]
        assert after == result.messages[2:]


async def test_a_turn_starts_eagerly_on_its_clients_own_worker(
    harness: HarnessFactory, tmp_path: Path, client: Client
) -> None:
    """A worker of the starting client polling the turn's queue gets its first workflow task in
    the start response (the SDK records whether the server did so on the handle); on a queue
    no worker of this client polls, the start is an ordinary one."""
    async with harness(TOOLS, **scripted(tmp_path, "hello")) as h:
        turn = await h.start("go")
        assert getattr(turn.handle, "__temporal_eagerly_started") is True
        result = await turn.result()
    assert result.final is not None and result.final.text == "hello"
    elsewhere = await start_turn(
        client, TurnInput(agent="test", messages=["go"]), task_queue=f"nobody-{tmp_path.name}"
    )
    assert getattr(elsewhere.handle, "__temporal_eagerly_started") is False
    await elsewhere.handle.terminate()


async def test_cancel_during_tools_keeps_finished_results_and_ends_canceled(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    gate.clear()
    config = scripted(
        tmp_path,
        {"tool_calls": dict([call("c1", "quick", "q"), call("c2", "wait_for_gate", "g")])},
        "never reached",
    )
    async with harness(TOOLS, **config) as h:
        turn = await h.start("go")
        async for message in turn.messages(include_tool_results=True):
            if message.tool_calls:
                break
        await asyncio.sleep(1.0)  # let the quick call finish; the gated one stays blocked
        await turn.cancel()
        with pytest.raises(TurnCancelledError) as cancelled:
            await turn.result()
        status = (await turn.handle.describe()).status
        current = await turn.current()
    gate.set()

    assert status == WorkflowExecutionStatus.CANCELED
    repaired = cancelled.value.result
    assert repaired is not None and repaired == current
    assert repaired.stop_reason == StopReason.CANCELLED
    assert repaired.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    last = repaired.history[-1]
    assert last.role == "user" and last.tool_results is not None
    assert last.tool_results["c1"].text == "q done" and not last.tool_results["c1"].is_error
    assert last.tool_results["c2"].text == INTERRUPTED_TEXT and last.tool_results["c2"].is_error


async def test_next_turn_continues_from_a_repaired_history(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    interrupted = [
        Message.user("go"),
        Message.model_validate(
            {
                "role": "assistant",
                "tool_calls": dict([call("c9", "quick", "x")]),
                "stop_reason": "toolUse",
            }
        ),
    ]
    async with harness(TOOLS, **scripted(tmp_path, "continuing")) as h:
        result = await h.run("again", history=[m.model_dump() for m in interrupted])
    heal = result.messages[0]
    assert heal.tool_results and heal.tool_results["c9"].text == INTERRUPTED_TEXT
    assert result.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    assert result.final is not None and result.final.text == "continuing"


async def test_cli_runs_a_turn_with_an_in_process_worker_and_shows_it(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    (tmp_path / "turnkeep.yaml").write_text(
        "task_queue: cli-test\n"
        "mcp:\n  servers:\n    toolbox:\n"
        f"      command: {sys.executable}\n"
        f"      args: [{DEMO_TOOLS}]\n"
        "agents:\n  demo:\n    model: passthrough\n    servers: [toolbox]\n",
        encoding="utf-8",
    )
    prompt = '***CALL_TOOL toolbox__calculate {"expression": "6 * 7"}'
    ran = await asyncio.to_thread(
        turnkeep,
        "run",
        prompt,
        "--worker",
        "--id",
        "cli-turn",
        "--json",
        temporal=temporal,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    # With --json the streamed turn goes to stderr, and stdout holds the result alone.
    assert "toolbox__calculate" in ran.stderr and "42" in ran.stderr
    assert "stop reason: endTurn" in ran.stderr
    result = json.loads(ran.stdout)
    assert result["final"]["content"][0]["text"] == "42"

    shown = await asyncio.to_thread(turnkeep, "show", "cli-turn", temporal=temporal, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "6 * 7" in shown.stdout and "42" in shown.stdout


async def test_cli_reports_a_bad_config_clearly(temporal: ServerInfo, tmp_path: Path) -> None:
    (tmp_path / "turnkeep.yaml").write_text("agents:\n  a:\n    modle: x\n", encoding="utf-8")
    ran = await asyncio.to_thread(turnkeep, "run", "hi", temporal=temporal, cwd=tmp_path)
    assert ran.returncode == 2
    assert ran.stderr == (
        f"error: {tmp_path / 'turnkeep.yaml'}: agents.a.modle: not a setting turnkeep knows "
        "(a misspelling?)\n"
    )


async def test_ctrl_c_in_cli_run_cancels_the_turn_and_shows_the_repair(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    (tmp_path / "turnkeep.yaml").write_text(
        "task_queue: cli-interrupt\n"
        "mcp:\n  servers:\n    srv:\n"
        f"      command: {sys.executable}\n"
        f"      args: [{STDIO_SCRIPT}]\n"
        "agents:\n  test:\n    model: passthrough\n    servers: [srv]\n",
        encoding="utf-8",
    )
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.address, "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turnkeep.cli",
        "run",
        '***CALL_TOOL srv__slow {"seconds": 120}',
        "--worker",
        "--id",
        "cli-interrupted",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    output = ""
    async with asyncio.timeout(120):
        while "srv__slow" not in output:  # the tool call has been streamed: the tool is running
            line = await proc.stdout.readline()
            assert line, f"run ended early: {output}"
            output += line.decode()
        proc.send_signal(signal.SIGINT)
        rest, errors = await proc.communicate()
    output += rest.decode()
    assert proc.returncode == 130, output + errors.decode()  # 128 + SIGINT, as shells say
    assert "interrupted: cancelling the turn" in output
    assert "history repair: appended_interrupted_tool_result" in output
    assert "stop reason: cancelled" in output


@pytest.mark.slow
async def test_cli_on_an_unreachable_server_says_so(tmp_path: Path) -> None:
    """No traceback: one line naming the address, and exit code 2 like other user errors."""
    (tmp_path / "turnkeep.yaml").write_text("agents:\n  test:\n    model: passthrough\n")
    nobody = ServerInfo(address=f"127.0.0.1:{free_port()}", ui_url=None, pid=0)
    done = await asyncio.to_thread(turnkeep, "show", "some-turn", temporal=nobody, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: nothing answers at {nobody.address} (connection refused): check that a "
        "Temporal server runs there and that this is its address (--address, "
        "TEMPORAL_ADDRESS); without either, turnkeep uses its own embedded server"
    ]
    assert "tonic" not in done.stderr


@pytest.mark.slow
async def test_cli_exit_codes_survive_leaving_without_finalization(tmp_path: Path) -> None:
    """`main` ends with os._exit: the codes click and typer give must come through."""

    def code(*args: str) -> int:
        done = subprocess.run(
            [sys.executable, "-m", "turnkeep.cli", *args],
            cwd=tmp_path,
            capture_output=True,
            check=False,
        )
        return done.returncode

    assert await asyncio.to_thread(code, "--help") == 0
    assert await asyncio.to_thread(code, "no-such-command") == 2
    assert await asyncio.to_thread(code, "show") == 2  # a missing argument is a usage error
