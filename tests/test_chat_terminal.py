"""`turnkeep chat` and `turnkeep run` as a person uses them: in a real terminal (a pty driven
with pexpect), against the test dev server, with the worker in the command's process, the
passthrough model and the test MCP server. Answers stream; a session carries its history;
Ctrl-C cancels the running turn and the REPL goes on; a session resumes; a call awaiting
approval is asked about at the terminal (yes, no, edit, or decided elsewhere meanwhile), and
without a terminal the command says how to decide it instead of asking."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import uuid
from pathlib import Path

import pexpect
import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from tests.mcp_servers.launch import STDIO_SCRIPT
from turnkeep.cli.wait_prompt import local_user
from turnkeep.cli.wait_question import PROMPT
from turnkeep.client.sessions import get_session, read_session
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.messages import Message
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio

# Generous: each step is one turn (or a worker's start) on a loaded 2-core machine.
WAIT = 120


def configure(tmp_path: Path) -> Path:
    """A turnkeep.yaml whose agent may call the test tools, `record` only once approved;
    returns the file `record` appends to."""
    record = tmp_path / "recorded.txt"
    server = {
        "command": sys.executable,
        "args": [str(STDIO_SCRIPT)],
        "env": {"TURNKEEP_TEST_RECORD": str(record)},
    }
    agent = {
        "model": "passthrough",
        "servers": ["srv"],
        "approval": {"tools": ["srv__record"], "timeout": "1d"},
    }
    config = {
        "task_queue": f"terminal-{uuid.uuid4().hex[:8]}",
        "mcp": {"servers": {"srv": server}},
        "agents": {"test": agent},
    }
    (tmp_path / "turnkeep.yaml").write_text(json.dumps(config), encoding="utf-8")
    return record


def environment(temporal: ServerInfo) -> dict[str, str]:
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.address, "COLUMNS": "200"}
    env["TERM"] = "dumb"  # no colour codes between the words the test looks for
    for editor in ("EDITOR", "VISUAL"):  # edits are typed as one line of JSON
        env.pop(editor, None)
    return env


class Terminal:
    """`turnkeep chat` on a pty: what a person types and sees."""

    def __init__(self, temporal: ServerInfo, cwd: Path, *args: str) -> None:
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "turnkeep.cli", "chat", "--agent", "test", "--worker", *args],
            cwd=str(cwd),
            env=environment(temporal),
            encoding="utf-8",
            timeout=WAIT,
            dimensions=(50, 200),
        )
        # Everything the terminal showed, for a failure's post-mortem (and `shown`).
        self.log = cwd / f"terminal-{uuid.uuid4().hex[:6]}.log"
        self.child.logfile_read = self.log.open("w", encoding="utf-8")

    async def see(self, text: str) -> None:
        await self.child.expect_exact(text, async_=True)

    async def see_each(self, *texts: str) -> None:
        """Each of ``texts``, in any order."""
        left = list(texts)
        while left:
            left.pop(await self.child.expect_exact(left, async_=True))

    async def see_pattern(self, pattern: str) -> re.Match[str]:
        await self.child.expect(pattern, async_=True)
        match = self.child.match
        assert isinstance(match, re.Match)
        return match

    async def prompt(self) -> None:
        """The REPL waits for the next line."""
        await self.see_pattern(r"\n> ")

    async def say(self, line: str, answer: str) -> None:
        """Type ``line`` at the REPL and see the model's answer stream in."""
        self.child.sendline(line)
        await self.see(f"assistant › {answer}")
        await self.prompt()

    async def quit(self, session_id: str) -> None:
        self.child.sendeof()  # Ctrl-D at the prompt leaves; the session stays, and it says how
        await self.see(f"resume it with `turnkeep chat --session {session_id}`")
        await self.child.expect(pexpect.EOF, async_=True)
        self.child.close()
        assert self.child.exitstatus == 0, self.child.before

    def shown(self) -> str:
        """Everything the terminal showed so far."""
        assert self.child.logfile_read is not None
        self.child.logfile_read.flush()
        return self.log.read_text(encoding="utf-8")


def record_call(tag: str) -> str:
    return f'***CALL_TOOL srv__record {{"tag": "{tag}"}}'


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


async def running_turn(client: Client, session_id: str) -> TurnHandle:
    turn = (await get_session(client, session_id).progress()).turn
    assert turn is not None
    return get_turn(client, turn.workflow_id)


@pytest.mark.slow
async def test_chat_in_a_terminal(temporal: ServerInfo, client: Client, tmp_path: Path) -> None:
    record = configure(tmp_path)
    chat = Terminal(temporal, tmp_path)
    session_id = (await chat.see_pattern(r"session (session-test-\S+)")).group(1)
    await chat.prompt()

    # Answers stream in; the second turn carries the first as history.
    await chat.say("hello there", "hello there")
    await chat.say("and again", "and again")
    second = await get_turn(client, f"{session_id}/turn-2").result()
    assert texts(second.history) == ["hello there", "hello there", "and again", "and again"]

    # Ctrl-C while a slow tool runs cancels that turn (its repair is shown); the REPL and the
    # session go on.
    chat.child.sendline('***CALL_TOOL srv__slow {"seconds": 600}')
    await chat.see("→ srv__slow")
    chat.child.sendintr()
    await chat.see("interrupted: cancelling the turn")
    await chat.see(INTERRUPTED_TEXT)
    await chat.prompt()
    described = await get_session(client, session_id).handle.describe()
    assert described.status == WorkflowExecutionStatus.RUNNING

    # A call awaiting approval is shown with its arguments and asked about: yes runs it.
    chat.child.sendline(record_call("yes-tag"))
    await chat.see("approval needed · srv__record · call ")
    await chat.see('"tag": "yes-tag"')
    await chat.see(PROMPT)
    chat.child.sendline("y")
    await chat.see("approved call ")
    await chat.see("assistant › yes-tag")
    await chat.prompt()

    # No, with a reason: the tool does not run, and the model is told why and by whom.
    chat.child.sendline(record_call("no-tag"))
    await chat.see(PROMPT)
    chat.child.sendline("n")
    await chat.see("Reason (optional): ")
    chat.child.sendline("not today")
    await chat.see("denied call ")
    await chat.see(f"assistant › Tool call denied by {local_user()}: not today")
    await chat.prompt()

    # Edit: typed JSON that is not an object is asked again; the call runs with the edit.
    chat.child.sendline(record_call("draft"))
    await chat.see(PROMPT)
    chat.child.sendline("e")
    chat.child.sendline("[1]")
    await chat.see("the arguments must be a JSON object")
    chat.child.sendline('{"tag": "edited"}')
    await chat.see("with edited arguments")
    await chat.see("assistant › edited")
    await chat.prompt()

    # Decided elsewhere while the prompt waits: the prompt says so and steps aside, and the
    # next line typed goes to the REPL.
    chat.child.sendline(record_call("elsewhere"))
    await chat.see(PROMPT)
    turn = await running_turn(client, session_id)
    [waiting] = await turn.pending_approvals()
    await turn.decide(waiting.call_id, True, by="someone-else")
    # (Which comes first depends on whether the prompt or the turn's end noticed first.)
    await chat.see_each("approved elsewhere, by someone-else", "assistant › elsewhere")
    await chat.prompt()
    await chat.say("still here", "still here")
    await chat.quit(session_id)
    assert record.read_text(encoding="utf-8").split() == ["yes-tag", "edited", "elsewhere"]
    # The tool call cancelled by Ctrl-C completed after its turn had: the SDK's core says so
    # at warning level, in a line of its own, which a person need not read.
    assert "sdk_core" not in chat.shown() and "Activity not found" not in chat.shown()
    # Nor is the cancelled call a warning: the person asked for it.
    assert "warning:" not in chat.shown() and "CancelledError" not in chat.shown()

    # A later chat resumes the session: its next turn has everything before as history.
    chat = Terminal(temporal, tmp_path, "--session", session_id)
    await chat.see(f"session {session_id}")
    await chat.prompt()
    await chat.say("after resume", "after resume")
    await chat.quit(session_id)
    view = await read_session(client, session_id)
    assert view is not None and view.turns[-1].result is not None
    last = view.turns[-1].result
    assert texts(last.history)[:4] == texts(second.history)
    assert texts(last.history)[-4:] == ["still here", "still here", "after resume", "after resume"]
    # No worker is left to run its close: end it by hand.
    await get_session(client, session_id).handle.terminate()


@pytest.mark.slow
async def test_run_without_a_terminal_says_how_to_decide(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    record = configure(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turnkeep.cli",
        "run",
        record_call("piped"),
        "--worker",
        cwd=tmp_path,
        env=environment(temporal),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        hint = None
        while hint is None:
            line = (await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode()
            assert line, "run ended without saying the call awaits approval"
            hint = re.search(r"turnkeep approve (\S+) (\S+)", line)
        assert "waiting for approval: call " in line and "Approve?" not in line
        await get_turn(client, hint.group(1)).decide(hint.group(2), True, by="ci")
        out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert "assistant › piped" in out.decode()
    assert record.read_text(encoding="utf-8").split() == ["piped"]
