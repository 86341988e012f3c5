"""An MCP server's secrets (in its ``args``, ``url``, ``env`` or ``headers``) stay in the worker's
configuration (issue 21, item 7): when the server fails to start or drops mid-turn, the workflow
history, the turn's result, ``turnkeep show --json`` and the worker's log name it by its config
name and transport only; the log says how it was started and what it wrote to stderr, with the
secrets redacted."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError

from tests.conftest import HarnessFactory, history_text, turnkeep, write_script
from tests.mcp_servers.launch import STDIO_SCRIPT, free_port, http_server
from turnkeep.client.turns import TurnHandle
from turnkeep.config.settings import McpServerSettings
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.tools.redaction import Redactor

TURN_WITHIN = 120.0
# One of each kind of secret a server's configuration can hold; each is unique enough that
# finding it anywhere means it leaked.
ARG = "arg-secret-5b0e2c"  # --token ARG
ARG_EQ = "argeq-secret-81d4aa"  # --api-key=ARG_EQ
EXPANDED = "expanded-secret-c4f9"  # a plain arg, the value of $TURNKEEP_TEST_VAULT_KEY
ENV = "env-secret-9a7d31"
PASSWORD = "userinfo-secret-60ce"
QUERY = "query-secret-2f8b17"
HEADER = "header-secret-d35a90"
SECRETS = (ARG, ARG_EQ, EXPANDED, ENV, PASSWORD, QUERY, HEADER)

TIMEOUTS = {"start_to_close": 30, "heartbeat": 5, "max_attempts": 2}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def vault(command: str, *args: str) -> dict[str, Any]:
    """A stdio server given a secret in every way a command line and environment can."""
    secrets = ["--token", ARG, f"--api-key={ARG_EQ}", EXPANDED]
    return {"command": command, "args": [*args, *secrets], "env": {"VAULT_TOKEN": ENV}}


def remote(port: int) -> dict[str, Any]:
    """An HTTP server given a secret in its URL's userinfo and query, and in a header."""
    return {
        "url": f"http://reader:{PASSWORD}@127.0.0.1:{port}/mcp?api_key={QUERY}",
        "headers": {"Authorization": f"Bearer {HEADER}"},
    }


def assert_no_secret(where: str, text: str) -> None:
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"{where} shows {leaked}:\n{text}"


def failure_texts(err: BaseException) -> str:
    texts = []
    cause: BaseException | None = err
    while cause is not None:
        texts.append(str(cause))
        cause = cause.__cause__
    return "\n".join(texts)


async def shown_as_json(turn: TurnHandle, temporal: ServerInfo, tmp_path: Path) -> str:
    shown: subprocess.CompletedProcess[str] = await asyncio.to_thread(
        turnkeep, "show", turn.workflow_id, "--json", temporal=temporal, cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout + shown.stderr


@pytest.fixture(autouse=True)
def expanded_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if the config said `args: ["${TURNKEEP_TEST_VAULT_KEY}"]`.
    monkeypatch.setenv("TURNKEEP_TEST_VAULT_KEY", EXPANDED)


# --- servers that cannot be reached when the turn starts ------------------------------------


async def test_servers_that_cannot_start_leak_no_secret(
    harness: HarnessFactory,
    temporal: ServerInfo,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()  # nothing listens: the connection is refused
    servers = {"vault": vault("no-such-mcp-server-xyz"), "remote": remote(port)}
    agent = {"model": "passthrough", "servers": ["vault", "remote"], "tool_timeouts": TIMEOUTS}
    async with harness(mcp={"servers": servers}, agents={"test": agent}) as h:
        turn = await h.start("go")
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(turn.result(), TURN_WITHIN)
    failure = failure_texts(failed.value)
    history = history_text(await turn.handle.fetch_history())
    shown = await shown_as_json(turn, temporal, tmp_path)

    for where, text in [("the failure", failure), ("the history", history), ("show", shown)]:
        assert_no_secret(where, text)
        assert (
            "MCP server 'vault' (stdio) could not be started: its command could not be run" in text
        )
        assert "MCP server 'remote' (http) could not be started: the connection was refused" in text
        assert "no-such-mcp-server-xyz" not in text and "127.0.0.1" not in text
    # The worker's log says how each server was started, with its secrets hidden.
    assert_no_secret("the worker's log", caplog.text)
    assert "MCP server 'vault' (stdio: no-such-mcp-server-xyz --token *** " in caplog.text
    assert "--api-key=*** ***) could not be started" in caplog.text
    assert f"MCP server 'remote' (http: http://***@127.0.0.1:{port}/mcp?api_key=***)" in (
        caplog.text
    )


# --- servers that drop mid-turn: the model reads why ----------------------------------------

gate = asyncio.Event()
at_gate = asyncio.Event()


async def hold() -> str:
    """Waits until the test lets it go."""
    at_gate.set()
    await gate.wait()
    return "released"


def vault_script(tmp_path: Path) -> Path:
    """The test tools server, until a ``broken`` file appears beside it: then it complains on
    stderr (quoting its secrets, as servers do) and exits."""
    script = tmp_path / "vault.py"
    script.write_text(
        "import os, runpy, sys\n"
        "from pathlib import Path\n"
        "here = Path(__file__).parent\n"
        "if (here / 'broken').exists():\n"
        "    print('vault: rejected', sys.argv[1:], os.environ['VAULT_TOKEN'], file=sys.stderr)\n"
        "    sys.exit(3)\n"
        "(here / 'vault.pid').write_text(str(os.getpid()))\n"
        f"sys.argv = [{str(STDIO_SCRIPT)!r}]\n"
        f"runpy.run_path({str(STDIO_SCRIPT)!r}, run_name='__main__')\n",
        encoding="utf-8",
    )
    return script


async def test_servers_that_drop_mid_turn_leak_no_secret(
    harness: HarnessFactory,
    temporal: ServerInfo,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)  # httpx logs each request's URL at INFO
    port = free_port()
    servers = {"vault": vault(sys.executable, str(vault_script(tmp_path))), "remote": remote(port)}
    calls = {"v1": call("vault__echo", text="hi"), "r1": call("remote__echo", text="hi")}
    script = write_script(
        tmp_path / "script.json",
        {"tool_calls": {"h1": call("local__hold")}},
        {"tool_calls": calls},
        "done",
    )
    agent = {
        "model": "playback",
        "playback": str(script),
        "servers": ["local", "vault", "remote"],
        "tool_timeouts": TIMEOUTS,
    }
    gate.clear()
    at_gate.clear()
    async with harness({"local": [hold]}, mcp={"servers": servers}, agents={"test": agent}) as h:
        async with http_server(port):
            turn = await h.start("go")
            await asyncio.wait_for(at_gate.wait(), 60)  # both servers listed their tools
        # Now the HTTP server is gone, and the stdio one dies and will not come back.
        (tmp_path / "broken").touch()
        os.kill(int((tmp_path / "vault.pid").read_text()), signal.SIGKILL)
        gate.set()
        result = await asyncio.wait_for(turn.result(), TURN_WITHIN)
    history = history_text(await turn.handle.fetch_history())
    shown = await shown_as_json(turn, temporal, tmp_path)

    assert result.final is not None and result.final.text == "done"
    answers = {cid: r for m in result.messages for cid, r in (m.tool_results or {}).items()}
    assert answers["v1"].is_error and "MCP server 'vault' (stdio)" in answers["v1"].text
    assert answers["r1"].is_error and "MCP server 'remote' (http)" in answers["r1"].text
    assert_no_secret("the turn's result", result.model_dump_json())
    assert_no_secret("the history", history)
    assert_no_secret("show", shown)
    assert_no_secret("the worker's log", caplog.text)
    # The log still tells what happened, stderr included.
    assert "MCP server 'vault' (stdio: " in caplog.text
    assert "vault: rejected" in caplog.text and "could not be started" in caplog.text
    # Its first line (all that `run` and `chat` show) ends with the server's last words.
    started = [line for line in caplog.text.splitlines() if "'vault' (stdio: " in line]
    assert any("could not be started" in line for line in started)
    assert all(
        line.endswith(
            "; its stderr ends: vault: rejected ['--token', '***', '--api-key=***', '***'] ***"
        )
        for line in started
        if "could not be started" in line
    )
    assert f"HTTP Request: POST http://***@127.0.0.1:{port}/mcp?api_key=***" in caplog.text


# --- what the redactor hides ----------------------------------------------------------------


def test_the_redactor_hides_each_kind_of_secret() -> None:
    stdio = Redactor.of(McpServerSettings.model_validate(vault("srv")))
    line = f"srv --token {ARG} --api-key={ARG_EQ} {EXPANDED} saw VAULT_TOKEN={ENV}"
    assert stdio(line) == "srv --token *** --api-key=*** *** saw VAULT_TOKEN=***"
    http = Redactor.of(McpServerSettings.model_validate(remote(8000)))
    said = f"401 for http://127.0.0.1:8000/mcp?api_key={QUERY}&v=2 (Bearer {HEADER}; {PASSWORD})"
    assert http(said) == "401 for http://127.0.0.1:8000/mcp?api_key=***&v=*** (***; ***)"
    # Any URL in the text loses its userinfo and query; nothing else is touched.
    plain = Redactor()
    assert plain("see https://u:p@example.com/x?t=abc#frag now") == (
        "see https://***@example.com/x?t=***#*** now"
    )
    assert plain("no answer to initialize within 30 s") == "no answer to initialize within 30 s"
