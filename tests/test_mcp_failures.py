"""MCP servers and tools failing under a running turn, and output the loop cannot take as is
(issue 5, items 4 and 8), and servers that are not there when a turn starts (issue 21, item 8).

- a stdio server process killed mid-call is restarted by the pool and the call retried: the
  turn gets the real result;
- an HTTP server that is down is retried until it is back; one that stays down past the retry
  budget becomes an isError result the model reads, and the turn still completes;
- an HTTP server that is down when the turn starts is waited for (listing its tools is
  retried); a stdio server whose command does not exist fails the turn at once;
- a tool that hangs is cut off by its timeout, and the model is told so;
- a tool returning bytes that are not UTF-8 (or a str that cannot be encoded) and a model
  response the provider adapter cannot parse each end in a clear message, never a stuck turn.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from tests.conftest import Harness, HarnessFactory, eventually, write_script
from tests.mcp_servers.launch import free_port, http_server
from tests.worker_process import effects_server
from turnkeep.client.turns import TurnHandle
from turnkeep.contract.messages import CallToolResult, StopReason, TextContent
from turnkeep.contract.turn_io import TurnResult
from turnkeep.testing.fake_api import FakeModelApi, Reply

pytestmark = pytest.mark.asyncio

TURN_WITHIN = 120.0


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def playback(tmp_path: Path, *script: Any, **agent: Any) -> dict[str, Any]:
    path = write_script(tmp_path / "script.json", *script)
    return {"model": "playback", "playback": str(path), **agent}


def tool_result(result: TurnResult, call_id: str) -> CallToolResult:
    for message in result.messages:
        if message.tool_results and call_id in message.tool_results:
            return message.tool_results[call_id]
    raise AssertionError(f"no result for {call_id}")


def log(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]


async def finish(turn: TurnHandle) -> TurnResult:
    return await asyncio.wait_for(turn.result(), TURN_WITHIN)


async def tool_attempts(turn: TurnHandle) -> list[int]:
    """The attempt on which each call_tool activity completed, in order of completion."""
    tools: set[int] = set()
    attempt: dict[int, int] = {}
    completed = []
    async for event in turn.handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == "call_tool":
                tools.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            attempt[attrs.scheduled_event_id] = attrs.attempt
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            scheduled = event.activity_task_completed_event_attributes.scheduled_event_id
            if scheduled in tools:
                completed.append(attempt[scheduled])
    return completed


async def last_attempts(turn: TurnHandle, activity: str) -> list[int]:
    """The last attempt of each ``activity`` that ended (its one started event records it)."""
    scheduled: set[int] = set()
    attempts = []
    async for event in turn.handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == activity:
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            if attrs.scheduled_event_id in scheduled:
                attempts.append(attrs.attempt)
    return attempts


async def pending_retry(turn: TurnHandle, activity: str = "call_tool") -> bool:
    """An ``activity`` has failed at least once and waits for (or runs) its retry."""
    description = await turn.handle.describe()
    return any(
        p.activity_type.name == activity and p.attempt >= 2
        for p in description.raw_description.pending_activities
    )


# --- a stdio server that crashes mid-call ---------------------------------------------------


async def test_stdio_server_killed_mid_call_is_restarted_and_the_call_retried(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    agent = playback(
        tmp_path,
        {"tool_calls": {"c1": call("effects__effect", tag="crash", seconds=2)}},
        "done",
        servers=["effects"],
    )
    config = {"mcp": {"servers": {"effects": effects_server(record)}}, "agents": {"test": agent}}
    async with harness(**config) as h:
        turn = await h.start("go")
        await eventually(lambda: any(e["event"] == "start" for e in log(record)))
        first_server = log(record)[0]["pid"]
        os.kill(first_server, signal.SIGKILL)
        result = await finish(turn)

    assert result.stop_reason == StopReason.END_TURN
    assert result.final is not None and result.final.text == "done"
    answer = tool_result(result, "c1")
    assert not answer.is_error and answer.text == "crash done"  # the real result
    runs = [e for e in log(record) if e["event"] == "start"]
    # Run twice, by two server processes (the pool started a new one), told the same key.
    assert len(runs) == 2 and runs[0]["pid"] == first_server != runs[1]["pid"]
    assert {e["key"] for e in runs} == {f"{turn.workflow_id}/c1"}
    assert await tool_attempts(turn) == [2]


# --- an HTTP server that is down ------------------------------------------------------------

gate = asyncio.Event()
at_gate = asyncio.Event()


async def hold() -> str:
    """Waits until the test lets it go."""
    at_gate.set()
    await gate.wait()
    return "released"


def remote_turn(tmp_path: Path, url: str, max_attempts: int) -> dict[str, Any]:
    """A turn that lists the remote server's tools, holds (so the test can take the server
    down), then calls a remote tool."""
    agent = playback(
        tmp_path,
        {"tool_calls": {"h1": call("local__hold")}},
        {"tool_calls": {"r1": call("remote__echo", text="hello")}},
        "done",
        servers=["local", "remote"],
        tool_timeouts={"start_to_close": 30, "heartbeat": 5, "max_attempts": max_attempts},
    )
    return {"mcp": {"servers": {"remote": {"url": url}}}, "agents": {"test": agent}}


async def start_holding(h: Harness) -> TurnHandle:
    gate.clear()
    at_gate.clear()
    turn = await h.start("go")
    await asyncio.wait_for(at_gate.wait(), 60)
    return turn


async def test_http_server_down_is_retried_until_it_is_back(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    port = free_port()
    config = remote_turn(tmp_path, f"http://127.0.0.1:{port}/mcp", max_attempts=8)
    async with harness({"local": [hold]}, **config) as h:
        async with http_server(port):
            turn = await start_holding(h)  # the tools were listed while the server was up
        gate.set()  # the server is down now
        await eventually(lambda: pending_retry(turn), within=60)
        async with http_server(port):
            result = await finish(turn)

    answer = tool_result(result, "r1")
    assert not answer.is_error and answer.text == "hello"
    assert result.stop_reason == StopReason.END_TURN
    attempts = await tool_attempts(turn)
    assert attempts[0] == 1 and attempts[1] >= 2  # hold ran once; echo needed retries


async def test_http_server_down_past_the_retry_budget_becomes_an_error_result(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    config = remote_turn(tmp_path, url, max_attempts=2)
    async with harness({"local": [hold]}, **config) as h:
        async with http_server(port):
            turn = await start_holding(h)
        gate.set()  # the server stays down
        result = await finish(turn)

    # The turn completed: the model was told, and answered.
    assert result.stop_reason == StopReason.END_TURN
    assert result.final is not None and result.final.text == "done"
    answer = tool_result(result, "r1")
    assert answer.is_error
    assert answer.text.startswith("Error: McpConnectionError: ")
    # Named by its config name and transport; its URL is for the worker's log only.
    assert "MCP server 'remote' (http)" in answer.text and url not in answer.text


# --- a server that is not there when the turn starts (issue 21, item 8) ---------------------


async def test_http_server_down_at_turn_start_is_retried_until_it_is_up(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    port = free_port()
    agent = playback(
        tmp_path,
        {"tool_calls": {"r1": call("remote__echo", text="hello")}},
        "done",
        servers=["remote"],
        tool_timeouts={"start_to_close": 30, "heartbeat": 5, "max_attempts": 10},
    )
    config = {
        "mcp": {"servers": {"remote": {"url": f"http://127.0.0.1:{port}/mcp"}}},
        "agents": {"test": agent},
    }
    async with harness(**config) as h:
        turn = await h.start("go")
        # Listing its tools was refused; the server comes up while the listing is retried.
        await eventually(lambda: pending_retry(turn, "list_tools"), within=60)
        async with http_server(port):
            result = await finish(turn)

    assert result.stop_reason == StopReason.END_TURN
    answer = tool_result(result, "r1")
    assert not answer.is_error and answer.text == "hello"
    (listed,) = await last_attempts(turn, "list_tools")
    assert listed >= 2


async def test_stdio_server_whose_command_is_missing_fails_the_turn_at_once(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    agent = playback(
        tmp_path,
        "never asked",
        servers=["gone"],
        tool_timeouts={"start_to_close": 30, "heartbeat": 5, "max_attempts": 10},
    )
    server = {"command": "no-such-mcp-server-xyz", "args": ["--token", "tok-secret-1c5e"]}
    config = {"mcp": {"servers": {"gone": server}}, "agents": {"test": agent}}
    async with harness(**config) as h:
        turn = await h.start("go")
        with pytest.raises(WorkflowFailureError) as failed:
            await finish(turn)

    error: BaseException | None = failed.value
    while error is not None and not isinstance(error, ApplicationError):
        error = error.__cause__
    assert isinstance(error, ApplicationError)
    assert error.type == "ServerUnavailable" and error.non_retryable
    # Clear, and naming neither the command nor its secret.
    assert error.message == (
        "MCP server 'gone' (stdio) could not be started: "
        "its command could not be run: No such file or directory"
    )
    assert await last_attempts(turn, "list_tools") == [1]


# --- a tool that hangs ----------------------------------------------------------------------


async def test_a_hanging_tool_is_cut_off_by_its_timeout(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    agent = playback(
        tmp_path,
        {"tool_calls": {"c1": call("effects__effect", tag="hang", seconds=3600)}},
        "gave up",
        servers=["effects"],
        # Listing the tools (which starts the server) runs under the same timeouts: long
        # enough for a loaded machine, far short of the hang.
        tool_timeouts={"start_to_close": 8, "heartbeat": 1, "max_attempts": 1},
    )
    config = {"mcp": {"servers": {"effects": effects_server(record)}}, "agents": {"test": agent}}
    async with harness(**config) as h:
        result = await finish(await h.start("go"))

    assert result.stop_reason == StopReason.END_TURN
    assert result.final is not None and result.final.text == "gave up"
    answer = tool_result(result, "c1")
    assert answer.is_error and "timeout" in answer.text.lower()
    assert [e["event"] for e in log(record)] == ["start", "applied"]  # cut off, never done


# --- output the loop cannot take as is (item 8) ---------------------------------------------

NOT_UTF8 = b"\xff\xfe\x00 not utf-8"


def raw_bytes() -> bytes:
    """Returns bytes that are not UTF-8."""
    return NOT_UTF8


def undecodable_text() -> str:
    """Returns a str with a lone surrogate (bytes decoded with surrogateescape)."""
    return NOT_UTF8.decode("utf-8", errors="surrogateescape")


def undecodable_block() -> list[Any]:
    """Returns a text block with a lone surrogate, bypassing FastMCP's serialisation."""
    import mcp.types

    return [mcp.types.TextContent(type="text", text="bad \udcff here")]


async def test_tools_returning_non_utf8_give_clear_results(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    calls = {
        "b": call("local__raw_bytes"),
        "t": call("local__undecodable_text"),
        "k": call("local__undecodable_block"),
    }
    agent = playback(tmp_path, {"tool_calls": calls}, "read them", servers=["local"])
    tools = {"local": [raw_bytes, undecodable_text, undecodable_block]}
    async with harness(tools, agents={"test": agent}) as h:
        result = await finish(await h.start("go"))

    assert result.stop_reason == StopReason.END_TURN
    assert result.final is not None and result.final.text == "read them"
    # bytes: FastMCP sends them base64-encoded, so nothing is lost.
    as_bytes = tool_result(result, "b")
    assert not as_bytes.is_error and base64.b64decode(as_bytes.text) == NOT_UTF8
    # a str that is not valid Unicode (given as text only, see build_function_server) and a
    # content block carrying one: turnkeep replaces what cannot be encoded, keeps the rest.
    as_text = tool_result(result, "t")
    assert not as_text.is_error and as_text.content == [TextContent(text="??\x00 not utf-8")]
    as_block = tool_result(result, "k")
    assert not as_block.is_error and as_block.content == [TextContent(text="bad ? here")]
    # The whole conversation is valid UTF-8 (it went through Temporal's payloads).
    json.dumps(result.model_dump(mode="json"), ensure_ascii=False).encode("utf-8")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelApi]:
    with FakeModelApi() as provider:
        yield provider


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_a_model_response_that_cannot_be_parsed_ends_the_turn_with_an_error(
    api: str, fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.reset()
    fake.script(Reply.raw(200, "{not json"), api=api)  # type: ignore[arg-type]
    base_url = fake.base_url_anthropic if api == "anthropic" else fake.base_url_openai
    config = {
        api: {"api_key": "sk-test", "base_url": base_url},
        "agents": {"test": {"model": f"{api}.test-model"}},
    }
    async with harness(**config) as h:
        result = await finish(await h.start("hi"))

    assert result.stop_reason == StopReason.ERROR
    assert result.final is not None and result.final.stop_reason == StopReason.ERROR
    error = (result.final.channels or {})["error"][0]
    assert isinstance(error, TextContent) and "ProviderResponseInvalid" in error.text
    assert "ProviderResponseInvalid" in result.final.text
    assert len(fake.requests) == 1  # not retried: the same answer would come back
