"""MCP server mode (``turnkeep serve``, ``turnkeep.doors.mcp_server``) with the ``mcp`` client SDK
on the real dev server: over stdio (the CLI as a subprocess) and streamable HTTP, the live text
as progress notifications, a client's cancellation cancelling the turn, a client that goes away
leaving it to finish, approvals decided over MCP, and turnkeep calling a turnkeep-served agent
as one of its MCP servers (two workers of different configs on one dev server)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult, TextContent
from temporalio.client import Client as TemporalClient

from tests.conftest import eventually, make_settings
from tests.worker_process import REPO, write_config
from turnkeep.client.sessions import get_session
from turnkeep.client.turns import get_turn
from turnkeep.contract.turn_io import TurnCancelledError
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.doors.mcp_server import TOOL_NAMES, McpDoor, mcp_server
from turnkeep.testing.environment import harness
from turnkeep.testing.fake_api import Answer, FakeModelApi, Reply
from turnkeep.worker.build import build_workers

pytestmark = pytest.mark.asyncio

KEY = "sk-turnkeep-mcp-5e1d"


def config(fake: FakeModelApi, task_queue: str, **agents: dict[str, Any]) -> dict[str, Any]:
    """Agents on the fake OpenAI API (each ``model`` its own script), streaming live text."""
    return {
        "openai": {"api_key": KEY, "base_url": fake.base_url_openai},
        "task_queue": task_queue,
        "streaming": {"listen": "127.0.0.1:0"},
        "agents": {
            name: {
                "model": f"openai.{name}-model",
                "llm_timeouts": {"start_to_close": 60, "heartbeat": 10, "max_attempts": 2},
                **agent,
            }
            for name, agent in agents.items()
        },
    }


def text(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


@contextlib.asynccontextmanager
async def served(
    client: TemporalClient,
    fake: FakeModelApi,
    tmp_path: Path,
    *,
    scope: str = "request",
    agents: list[str] | None = None,
    function_tools: dict[str, Any] | None = None,
    **agent_config: dict[str, Any],
) -> AsyncIterator[tuple[McpDoor, str]]:
    """A worker for ``agent_config``'s agents and a door serving them over HTTP."""
    queue = f"test-mcp-{uuid.uuid4().hex[:8]}"
    settings = make_settings(tmp_path, **config(fake, queue, **agent_config))
    # The workers `turnkeep worker` runs: one on each agent's queue, where the door starts turns.
    async with build_workers(client, settings, function_tools=function_tools):
        door = McpDoor(client, settings, agents=agents, scope=scope)  # type: ignore[arg-type]
        async with door.serve_http() as url:
            yield door, url


async def call_with_progress(
    mcp: Client,
    tool: str,
    message: str,
    on_progress: asyncio.Event | None = None,
    release: threading.Event | None = None,
) -> tuple[CallToolResult, list[str]]:
    """The call's result and the text of its progress notifications; ``on_progress`` and
    ``release`` (an answer's held last chunk) are set at the first."""
    progress: list[str] = []

    async def record(value: float, total: float | None, note: str | None) -> None:
        progress.append(note or "")
        if on_progress is not None:
            on_progress.set()
        if release is not None:
            release.set()

    result = await mcp.call_tool(tool, {"message": message}, progress_callback=record)
    return result, progress


async def test_http_calls_stream_live_text_and_a_shared_session_keeps_the_conversation(
    client: TemporalClient, fake: FakeModelApi, tmp_path: Path
) -> None:
    # The answer's last chunk waits for the first progress notification: the live text cannot
    # have ended before the call's follower reads it.
    held = threading.Event()
    fake.script(Answer(text="Paris is the capital of France.", hold=held), model="helper-model")
    fake.script(Reply.text("About two million people."), model="helper-model")
    fake.script(Reply.text("A fresh start."), model="helper-model")
    async with served(
        client,
        fake,
        tmp_path,
        scope="shared",
        agents=["helper"],
        helper={"description": "Answers geography questions."},
        other={},
    ) as (door, url):
        async with Client(url) as mcp:
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            # Only the served agents (--agents narrowed them), named and shaped as fast-agent's.
            assert set(tools) == {"helper", *TOOL_NAMES}
            helper = tools["helper"]
            assert helper.description == "Answers geography questions."
            assert helper.input_schema["required"] == ["message"]
            first, progress = await call_with_progress(
                mcp, "helper", "Capital of France?", release=held
            )
            assert not first.is_error and text(first) == "Paris is the capital of France."
            # The live text came as progress notifications, word by word.
            assert "".join(progress) == "Paris is the capital of France." and len(progress) > 1
        # Another client, the same shared session: the model sees the first exchange.
        async with Client(url) as mcp:
            second = await mcp.call_tool("helper", {"message": "And its population?"})
            assert text(second) == "About two million people."
            # Its session ended elsewhere (`turnkeep sessions close`): the next call opens one.
            [first_turn, *_] = door.turn_ids
            await get_session(client, first_turn.rsplit("/", 1)[0]).close()
            third = await mcp.call_tool("helper", {"message": "Hello again."})
            assert text(third) == "A fresh start."
    asked = [r.body["messages"] for r in fake.requests_for_model("helper-model")]
    assert [m["content"] for m in asked[1] if m["role"] == "user"] == [
        "Capital of France?",
        "And its population?",
    ]
    assert [m["content"] for m in asked[2] if m["role"] == "user"] == ["Hello again."]
    # The first two calls were turns of one session, the third of the next.
    sessions = [turn.rsplit("/", 1)[0] for turn in door.turn_ids]
    assert sessions[0] == sessions[1] != sessions[2]


async def test_a_client_cancelling_a_call_cancels_the_turn_which_repairs_itself(
    client: TemporalClient, fake: FakeModelApi, tmp_path: Path
) -> None:
    held = threading.Event()
    fake.script(
        Answer(text="A long answer that never gets finished.", hold=held), model="helper-model"
    )
    try:
        async with served(client, fake, tmp_path, helper={}) as (door, url):
            # A handshake-era connection: its client sends notifications/cancelled.
            async with Client(url, mode="legacy") as mcp:
                streaming = asyncio.Event()
                call = asyncio.create_task(
                    call_with_progress(mcp, "helper", "Tell me a story.", streaming)
                )
                await asyncio.wait_for(streaming.wait(), 30)
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
            [turn_id] = door.turn_ids
            turn = get_turn(client, turn_id)
            with pytest.raises(TurnCancelledError) as cancelled:
                await asyncio.wait_for(turn.result(), 30)
    finally:
        held.set()
    # The repaired conversation: the prompt, nothing half-said.
    repaired = cancelled.value.result
    assert repaired is not None and repaired.messages[-1].role == "user"


async def test_a_client_that_goes_away_leaves_the_turn_to_finish(
    client: TemporalClient, fake: FakeModelApi, tmp_path: Path
) -> None:
    held = threading.Event()
    fake.script(Answer(text="Finished without anyone listening.", hold=held), model="helper-model")
    try:
        async with served(client, fake, tmp_path, helper={}) as (door, url):
            streaming = asyncio.Event()

            async def call_then_vanish() -> None:
                async with Client(url) as mcp:
                    await call_with_progress(mcp, "helper", "Go on.", streaming)

            call = asyncio.create_task(call_then_vanish())
            await asyncio.wait_for(streaming.wait(), 30)
            call.cancel()  # the connection closes with the call in flight
            with contextlib.suppress(asyncio.CancelledError):
                await call
            [turn_id] = door.turn_ids
            held.set()
            async with Client(url) as mcp:
                status = await mcp.call_tool(
                    "turnkeep_status", {"turn_id": turn_id, "wait_seconds": 30}
                )
    finally:
        held.set()
    assert status.structured_content == {
        "turn_id": turn_id,
        "agent": "helper",
        "status": "completed",
        "text": "Finished without anyone listening.",
        "error": None,
    }


written: list[str] = []


def write(text: str) -> str:
    """Write the text."""
    written.append(text)
    return "written"


async def test_approvals_decided_over_mcp_reach_the_turn_and_bad_input_is_one_line(
    client: TemporalClient, fake: FakeModelApi, tmp_path: Path
) -> None:
    fake.script(
        Reply.tool_calls(("w1", "fs__write", {"text": "draft"})),
        Reply.text("Written."),
        model="scribe-model",
    )
    written.clear()
    scribe = {"servers": ["fs"], "approval": {"tools": ["fs__write"]}}
    tools = {"fs": [write]}
    async with (
        served(client, fake, tmp_path, function_tools=tools, scribe=scribe) as (door, url),
        Client(url) as mcp,
    ):
        started = await mcp.call_tool("turnkeep_start", {"agent": "scribe", "message": "Go."})
        turn_id = started.structured_content["turn_id"]  # type: ignore[index]

        async def waiting() -> list[dict[str, Any]]:
            answer = await mcp.call_tool("turnkeep_pending", {})
            return answer.structured_content["approvals"]  # type: ignore[index,no-any-return]

        [call] = await eventually(waiting, "the write call awaits approval")
        assert (call["turn_id"], call["call_id"], call["name"]) == (turn_id, "w1", "fs__write")
        assert written == []
        # A call that is not waiting: refused by the turn, which goes on waiting for w1.
        stray = await mcp.call_tool(
            "turnkeep_decide", {"turn_id": turn_id, "call_id": "w9", "approve": True}
        )
        [still] = await waiting()
        assert still["call_id"] == "w1"
        decided = await mcp.call_tool(
            "turnkeep_decide",
            {"turn_id": turn_id, "call_id": "w1", "approve": True, "reason": "fine"},
        )
        assert not decided.is_error
        assert decided.structured_content["by"] == "mcp"  # type: ignore[index]
        done = await mcp.call_tool("turnkeep_status", {"turn_id": turn_id, "wait_seconds": 30})
        assert done.structured_content["status"] == "completed"  # type: ignore[index]
        assert done.structured_content["text"] == "Written."  # type: ignore[index]
        assert written == ["draft"]

        # Bad input: an MCP tool error in one line each; nothing started, nothing stuck.
        again = await mcp.call_tool(
            "turnkeep_decide", {"turn_id": turn_id, "call_id": "w1", "approve": False}
        )
        ghost = await mcp.call_tool("turnkeep_start", {"agent": "ghost", "message": "hi"})
        nowhere = await mcp.call_tool("turnkeep_status", {"turn_id": "turn-nope"})
        cancel_done = await mcp.call_tool("turnkeep_cancel", {"turn_id": turn_id})
    for refused, says in (
        (stray, "no call 'w9' is waiting for approval (waiting: w1)"),
        (again, "decision refused: workflow execution already completed"),
        (ghost, "unknown agent 'ghost': this server serves scribe; nothing was started"),
        (nowhere, "no turn 'turn-nope' of an agent this server serves"),
        (cancel_done, "has ended (completed): nothing to cancel"),
    ):
        assert refused.is_error and says in text(refused) and "\n" not in text(refused)
    assert door.turn_ids == [turn_id]


async def test_turnkeep_calls_a_turnkeep_served_agent_as_an_mcp_server(
    client: TemporalClient, fake: FakeModelApi, tmp_path: Path
) -> None:
    fake.script(Reply.text("42"), model="inner-model")
    fake.script(
        Reply.tool_calls(("c1", "inner_door__inner", {"message": "What is 6*7?"})),
        Reply.text("The inner agent says 42."),
        model="outer-model",
    )
    async with served(client, fake, tmp_path / "a", inner={"description": "Does sums."}) as (
        door,
        url,
    ):
        # Another worker, of another config, on the same dev server: its agent's MCP server is
        # the first worker's agent, served by the door.
        queue = f"test-outer-{uuid.uuid4().hex[:8]}"
        outer = config(fake, queue, outer={"servers": ["inner_door"]})
        outer["mcp"] = {"servers": {"inner_door": {"url": url}}}
        settings = make_settings(tmp_path / "b", **outer)
        async with harness(client, settings, task_queue=queue, default_agent="outer") as h:
            result = await h.run("Ask the inner agent.")
    assert result.final is not None and result.final.text == "The inner agent says 42."
    [tool_message] = [m for m in result.messages if m.tool_results]
    assert "42" in tool_message.tool_results["c1"].model_dump_json()
    [inner_turn] = door.turn_ids
    inner = await get_turn(client, inner_turn).result()
    assert inner.messages[0].text == "What is 6*7?"


async def test_mcp_server_entry_point_refuses_agents_the_settings_lack(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, agents={"a": {"model": "passthrough"}})
    # No Temporal call is made building the server.
    fake_client: Any = object()
    server = mcp_server(fake_client, settings, scope="connection")
    assert {t.name for t in await server.list_tools()} == {"a", *TOOL_NAMES}
    with pytest.raises(ValueError, match="no agent 'b' in the configuration"):
        mcp_server(fake_client, settings, agents=["b"])


async def test_stdio_serve_subprocess_keeps_a_session_per_connection_and_cancels_on_request(
    temporal: ServerInfo, client: TemporalClient, fake: FakeModelApi, tmp_path: Path
) -> None:
    queue = f"test-stdio-{uuid.uuid4().hex[:8]}"
    cfg = write_config(tmp_path / "turnkeep.yaml", config(fake, queue, helper={}, hidden={}))
    held, never = threading.Event(), threading.Event()
    fake.script(
        Answer(text="Hello over stdio.", hold=held),
        Reply.text("Still here."),
        Answer(text="Words that stop halfway.", hold=never),
        model="helper-model",
    )
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m", "turnkeep.cli", "serve", "--transport", "stdio", "--config", str(cfg),
            "--address", temporal.address, "--worker", "--agents", "helper",
            "--instance-scope", "connection",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
    )  # fmt: skip
    errlog = (tmp_path / "stderr.log").open("w+", encoding="utf-8")
    with errlog:
        async with Client(stdio_client(params, errlog=errlog)) as mcp:  # type: ignore[arg-type]
            names = {t.name for t in (await mcp.list_tools()).tools}
            first, progress = await call_with_progress(mcp, "helper", "Hi!", release=held)
            second = await mcp.call_tool("helper", {"message": "Again?"})
            # A call the client cancels: its turn is cancelled too.
            streaming = asyncio.Event()
            call = asyncio.create_task(call_with_progress(mcp, "helper", "More?", streaming))
            try:
                await asyncio.wait_for(streaming.wait(), 30)
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call

                async def third_turn() -> list[str]:
                    listed = client.list_workflows(f"TaskQueue = '{queue}.helper'")
                    return [w.id async for w in listed if w.id.endswith("/turn-3")]

                [third] = await eventually(third_turn, "the third turn is listed")
                with pytest.raises(TurnCancelledError):
                    await asyncio.wait_for(get_turn(client, third).result(), 30)
            finally:
                never.set()
        errlog.seek(0)
        stderr = errlog.read()
    assert names == {"helper", *TOOL_NAMES}
    assert text(first) == "Hello over stdio." and "".join(progress) == "Hello over stdio."
    assert text(second) == "Still here."
    # One session for the connection: the second turn's model call saw the first exchange.
    asked = fake.requests_for_model("helper-model")[1].body["messages"]
    assert [m["content"] for m in asked if m["role"] == "user"] == ["Hi!", "Again?"]
    # Every line but JSON-RPC went to stderr.
    assert "serving helper over MCP on stdio" in stderr


async def test_http_serve_subprocess_serves_only_the_named_agents_and_stops_on_sigterm(
    temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    queue = f"test-http-{uuid.uuid4().hex[:8]}"
    cfg = write_config(tmp_path / "turnkeep.yaml", config(fake, queue, helper={}, hidden={}))
    fake.script(Reply.text("Over HTTP."), model="helper-model")
    argv = [
        sys.executable, "-m", "turnkeep.cli", "serve", "--port", "0", "--config", str(cfg),
        "--address", temporal.address, "--worker", "--agents", "helper",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("serving helper over MCP at http://127.0.0.1:")
        url = line.split(" at ", 1)[1].strip()
        async with Client(url) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            answer = await mcp.call_tool("helper", {"message": "Hello?"})
            empty = await mcp.call_tool("helper", {"message": ""})
    finally:
        if proc.returncode is None:
            proc.terminate()
        code = await asyncio.wait_for(proc.wait(), 30)
    assert names == {"helper", *TOOL_NAMES}
    assert text(answer) == "Over HTTP."
    # The tool's input is validated: an empty message starts nothing.
    assert empty.is_error and text(empty) == (
        "invalid arguments for helper: message: String should have at least 1 character"
    )
    assert len(fake.requests_for_model("helper-model")) == 1
    assert code == 0
