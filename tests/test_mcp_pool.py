"""ToolServers against real MCP servers (stdio and streamable HTTP subprocesses, in-process function
tools), the tool activities outside a workflow, and tool-result truncation."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import mcp.types
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.mcp_servers.launch import STDIO_SCRIPT, free_port, http_server
from turnkeep.activities.tools import ToolActivities, json_size, to_wire_result, truncate_result
from turnkeep.config.catalog import AgentCatalog
from turnkeep.config.settings import Settings
from turnkeep.contract.activity_io import ToolCallRequest, ToolsRequest
from turnkeep.contract.messages import CallToolResult, ImageContent, TextContent
from turnkeep.tools.registry import ToolServers
from turnkeep.tools.source import ServerConnectionError, ServerUnavailable

LIMIT = 256 * 1024


def stdio(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(STDIO_SCRIPT)], **extra}


def settings(tmp_path: Path, **config: Any) -> Settings:
    return Settings.model_validate({**config, "base_dir": tmp_path})


@asynccontextmanager
async def pool_of(
    tmp_path: Path,
    servers: dict[str, dict[str, Any]] | None = None,
    functions: dict[str, list[Any]] | None = None,
    **config: Any,
) -> AsyncIterator[ToolServers]:
    async with ToolServers(
        settings(tmp_path, mcp={"servers": servers or {}}, **config), functions
    ) as pool:
        yield pool


async def call_text(pool: ToolServers, server: str, tool: str, **arguments: Any) -> str:
    result = await pool.call_tool(server, tool, arguments)
    assert not result.is_error, result
    return to_wire_result(result).text


async def server_pid(pool: ToolServers, server: str) -> int:
    return int(await call_text(pool, server, "pid"))


# The module-wide HTTP server, which is meant to outlive single tests.
_shared_ports: set[int] = set()


def live_test_servers(*, include_shared: bool = False) -> list[int]:
    """Pids of this process's children still running a test MCP server (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, ...
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        args = cmdline.split(b"\0")
        if int(ppid) != os.getpid() or state == "Z" or str(STDIO_SCRIPT).encode() not in args:
            continue
        if not include_shared and any(str(port).encode() in args for port in _shared_ports):
            continue
        found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
async def no_leaked_servers() -> AsyncIterator[None]:
    yield
    for _ in range(50):
        if not live_test_servers():
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"test MCP server processes outlived the test: {live_test_servers()}")


@pytest.fixture(scope="module", autouse=True)
async def no_leaked_servers_at_all() -> AsyncIterator[None]:
    yield
    for _ in range(50):
        if not live_test_servers(include_shared=True):
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"test MCP servers outlived the module: {live_test_servers(include_shared=True)}")


@pytest.fixture(scope="module")
async def http_url(no_leaked_servers_at_all: None) -> AsyncIterator[str]:
    port = free_port()
    _shared_ports.add(port)
    async with http_server(port) as url:
        yield url


# Each test over a remote server starts a Python process serving MCP: `slow`.
@pytest.fixture(params=[pytest.param(t, marks=pytest.mark.slow) for t in ("stdio", "http")])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The test server's settings, reached over stdio or over streamable HTTP."""
    if request.param == "stdio":
        return stdio()
    return {"url": request.getfixturevalue("http_url")}


# --- remote servers ----------------------------------------------------------------------------


async def test_lists_and_calls_tools(tmp_path: Path, remote: dict[str, Any]) -> None:
    # One test, because starting a server costs seconds.
    async with pool_of(tmp_path, {"t": remote}) as pool:
        tools = {tool.name: tool for tool in await pool.list_tools("t")}
        assert {"echo", "add", "fail", "slow", "record", "big", "pid"} <= set(tools)
        assert tools["add"].description == "Add two integers."
        assert tools["add"].input_schema["required"] == ["a", "b"]

        assert await call_text(pool, "t", "add", a=2, b=40) == "42"
        assert await call_text(pool, "t", "echo", text="héllo ✓") == "héllo ✓"

        # A tool that fails answers with an error result; the connection is not at fault.
        before = await server_pid(pool, "t")
        result = await pool.call_tool("t", "fail", {"message": "no luck"})
        assert result.is_error
        assert "no luck" in to_wire_result(result).text
        assert await server_pid(pool, "t") == before


async def test_concurrent_calls_share_one_connection(
    tmp_path: Path, remote: dict[str, Any]
) -> None:
    async with pool_of(tmp_path, {"t": remote}) as pool:
        # All five start before the server is open: the pool must open it once, not five times.
        pids = await asyncio.gather(*(server_pid(pool, "t") for _ in range(5)))
        assert len(set(pids)) == 1

        seconds = [0.5 + i / 100 for i in range(5)]
        results = await asyncio.gather(*(call_text(pool, "t", "slow", seconds=s) for s in seconds))
        assert results == [f"slept {s}" for s in seconds]


async def test_cancelling_a_call_leaves_the_connection_usable(
    tmp_path: Path, remote: dict[str, Any]
) -> None:
    async with pool_of(tmp_path, {"t": remote}) as pool:
        before = await server_pid(pool, "t")
        call = asyncio.create_task(pool.call_tool("t", "slow", {"seconds": 60}))
        await asyncio.sleep(0.5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await call_text(pool, "t", "echo", text="still here") == "still here"
        assert await server_pid(pool, "t") == before


@pytest.mark.slow
async def test_stdio_env_and_relative_cwd(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    server = stdio(cwd="work", env={"TURNKEEP_TEST_RECORD": "record.txt"})
    async with pool_of(tmp_path, {"t": server}) as pool:
        assert await call_text(pool, "t", "record", tag="first") == "first"
        assert await call_text(pool, "t", "record", tag="second") == "second"
    # A relative env path resolved in the relative cwd, itself resolved from base_dir.
    assert (tmp_path / "work" / "record.txt").read_text() == "first\nsecond\n"


@pytest.mark.slow
async def test_killed_stdio_server_is_reopened(tmp_path: Path) -> None:
    async with pool_of(tmp_path, {"t": stdio()}) as pool:
        old = await server_pid(pool, "t")
        os.kill(old, signal.SIGKILL)

        failures = 0
        new = None
        for _ in range(3):
            try:
                new = await server_pid(pool, "t")
                break
            except ServerConnectionError as err:
                assert "'t'" in str(err)
                failures += 1
        assert failures <= 1
        assert new is not None and new != old
        assert live_test_servers() == [new]


@pytest.mark.slow
async def test_http_server_down_then_back(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    async with pool_of(tmp_path, {"t": {"url": url}}) as pool:
        async with http_server(port):
            assert await call_text(pool, "t", "add", a=1, b=1) == "2"
        # The server is gone now. The open connection fails once (or is already known dead);
        # then the pool tries to reopen it and says plainly that the server cannot be reached.
        with pytest.raises((ServerConnectionError, ServerUnavailable)):
            await pool.call_tool("t", "add", {"a": 1, "b": 2})
        with pytest.raises(ServerUnavailable) as down:
            await pool.call_tool("t", "add", {"a": 1, "b": 2})
        # Named by its transport, not its URL; worth trying again.
        assert str(down.value) == (
            "MCP server 't' (http) could not be started: the connection was refused"
        )
        assert down.value.transient

        async with http_server(port):
            assert await call_text(pool, "t", "add", a=1, b=3) == "4"


# --- servers that cannot start -----------------------------------------------------------------


async def test_missing_command_is_server_unavailable(tmp_path: Path) -> None:
    async with pool_of(tmp_path, {"weather": {"command": "no-such-mcp-server-xyz"}}) as pool:
        with pytest.raises(ServerUnavailable) as err:
            await pool.list_tools("weather")
    # The command is for the worker's log, not for the failure.
    assert str(err.value) == (
        "MCP server 'weather' (stdio) could not be started: "
        "its command could not be run: No such file or directory"
    )
    assert err.value.server == "weather" and not err.value.transient


async def test_server_that_exits_logs_its_stderr(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    code = "import sys; print('missing API key WEATHER_KEY', file=sys.stderr); sys.exit(3)"
    server = {"command": sys.executable, "args": ["-c", code]}
    async with pool_of(tmp_path, {"weather": server}) as pool:
        with pytest.raises(ServerUnavailable) as err:
            await pool.call_tool("weather", "forecast", {})
    assert str(err.value) == (
        "MCP server 'weather' (stdio) could not be started: "
        "the server exited before initialization completed"
    )
    assert not err.value.transient
    # What it said goes to the worker's log (it may quote the server's secrets), not into the
    # failure, which reaches the workflow history.
    logged = caplog.text
    assert "MCP server 'weather' (stdio: " in logged and "missing API key WEATHER_KEY" in logged


async def test_server_that_never_initializes_times_out(tmp_path: Path) -> None:
    server = {"command": sys.executable, "args": ["-c", "import time; time.sleep(60)"]}
    async with pool_of(tmp_path, {"mute": {**server, "init_timeout": 1}}) as pool:
        with pytest.raises(ServerUnavailable, match="no answer to initialize within 1 s") as err:
            await pool.list_tools("mute")
    assert err.value.transient


async def test_unknown_server_and_bad_names(tmp_path: Path) -> None:
    async with pool_of(tmp_path, {"t": stdio()}) as pool:
        with pytest.raises(KeyError) as err:
            await pool.list_tools("nope")
    assert str(err.value) == "no MCP server named 'nope' in this worker's configuration (known: t)"
    with pytest.raises(ValueError, match="must not contain '__'"):
        ToolServers(settings(tmp_path, mcp={"servers": {"my__server": stdio()}}))


# --- function tools ----------------------------------------------------------------------------


def shout(text: str, times: int = 1) -> str:
    """Upper-case the text, repeated."""
    return " ".join([text.upper()] * times)


async def whisper(text: str) -> str:
    """Lower-case the text."""
    await asyncio.sleep(0)
    return text.lower()


def boom(x: int) -> str:
    """Always fails."""
    raise ValueError("boom")


async def aboom() -> str:
    raise ValueError("boom")


naps_cancelled: list[float] = []


async def nap(seconds: float) -> str:
    """Sleep."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        naps_cancelled.append(seconds)
        raise
    return "rested"


async def test_function_tools(tmp_path: Path) -> None:
    functions = {"fn": [shout, whisper, boom, aboom, nap]}
    async with pool_of(tmp_path, functions=functions) as pool:
        tools = {tool.name: tool for tool in await pool.list_tools("fn")}
        assert set(tools) == {"shout", "whisper", "boom", "aboom", "nap"}
        # The wrapper that rewrites errors must not hide the signature or docstring.
        assert tools["shout"].description == "Upper-case the text, repeated."
        assert tools["shout"].input_schema["properties"] == {
            "text": {"type": "string"},
            "times": {"type": "integer", "default": 1},
        }
        assert tools["shout"].input_schema["required"] == ["text"]

        assert await call_text(pool, "fn", "shout", text="hey", times=2) == "HEY HEY"
        assert await call_text(pool, "fn", "whisper", text="HEY") == "hey"
        for name, args in (("boom", {"x": 1}), ("aboom", {})):
            result = to_wire_result(await pool.call_tool("fn", name, args))
            assert result.is_error
            assert result.text == "Error: boom"

        call = asyncio.create_task(pool.call_tool("fn", "nap", {"seconds": 60}))
        await asyncio.sleep(0.2)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await call_text(pool, "fn", "nap", seconds=0) == "rested"
        # The client told the server, which stopped the work instead of sleeping on.
        assert naps_cancelled == [60]


async def test_function_tools_from_import_paths(tmp_path: Path) -> None:
    paths = {"paths": ["os.path:basename"], "broken": ["no_such_mod:f"]}
    async with pool_of(tmp_path, function_tools=paths) as pool:
        assert await call_text(pool, "paths", "basename", p="/a/b.txt") == "b.txt"
        with pytest.raises(ServerUnavailable) as err:
            await pool.list_tools("broken")
    assert "'broken' (function tools)" in str(err.value)
    assert "no_such_mod" in str(err.value)


# --- the activities ----------------------------------------------------------------------------


@pytest.fixture
async def activities(tmp_path: Path) -> AsyncIterator[ToolActivities]:
    config = settings(
        tmp_path,
        mcp={
            "servers": {
                "t": stdio(),
                "down": {"command": "no-such-mcp-server-xyz"},
                "offline": {"url": f"http://127.0.0.1:{free_port()}/mcp"},
            }
        },
        function_tools={"fn": []},
        agents={
            "test": {"servers": ["t", "fn"], "tools": {"t": ["add", "e*"]}},
            "everything": {"servers": ["t"]},
            "broken": {"servers": ["t", "down"]},
            "unreachable": {"servers": ["t", "offline"]},
            "both": {"servers": ["offline", "down"]},
        },
        max_tool_result_bytes=LIMIT,
    )
    async with ToolServers(config, {"fn": [shout, boom]}) as pool:
        yield ToolActivities(AgentCatalog.of(config), pool, max_result_bytes=LIMIT)


@pytest.fixture
def env() -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=3))
    return env


@pytest.mark.slow
async def test_list_tools_activity_namespaces_and_filters(
    activities: ToolActivities, env: ActivityEnvironment
) -> None:
    catalog = await env.run(activities.list_tools, ToolsRequest(agent="test"))
    assert [t.name for t in catalog.tools] == ["t__echo", "t__add", "fn__shout", "fn__boom"]
    add = catalog.tools[1]
    assert add.description == "Add two integers."
    assert add.input_schema["properties"]["a"] == {"type": "integer"}


@pytest.mark.slow
async def test_list_tools_activity_errors(
    activities: ToolActivities, env: ActivityEnvironment
) -> None:
    with pytest.raises(ApplicationError) as err:
        await env.run(activities.list_tools, ToolsRequest(agent="nobody"))
    assert err.value.type == "UnknownAgent" and err.value.non_retryable

    with pytest.raises(ApplicationError) as err:
        await env.run(activities.list_tools, ToolsRequest(agent="broken"))
    assert err.value.type == "ServerUnavailable" and err.value.non_retryable
    assert "MCP server 'down'" in str(err.value)

    # A refused connection may pass: Temporal retries the listing.
    with pytest.raises(ApplicationError) as err:
        await env.run(activities.list_tools, ToolsRequest(agent="unreachable"))
    assert err.value.type == "McpConnectionError" and not err.value.non_retryable
    assert err.value.message == (
        "MCP server 'offline' (http) could not be started: the connection was refused"
    )
    assert err.value.__cause__ is None  # whose text could quote the URL

    # With a server that cannot start at all, retrying is pointless; the error names both.
    with pytest.raises(ApplicationError) as err:
        await env.run(activities.list_tools, ToolsRequest(agent="both"))
    assert err.value.type == "ServerUnavailable" and err.value.non_retryable
    assert err.value.message.splitlines() == [
        "MCP server 'offline' (http) could not be started: the connection was refused",
        "MCP server 'down' (stdio) could not be started: "
        "its command could not be run: No such file or directory",
    ]


@pytest.mark.slow
async def test_call_tool_activity(activities: ToolActivities, env: ActivityEnvironment) -> None:
    heartbeats: list[Any] = []
    env.on_heartbeat = lambda *details: heartbeats.append(details)

    def request(name: str, **arguments: Any) -> ToolCallRequest:
        return ToolCallRequest(agent="test", call_id="call_1", name=name, arguments=arguments)

    outcome = await env.run(activities.call_tool, request("t__add", a=2, b=3))
    assert outcome.result.text == "5" and not outcome.result.is_error
    assert outcome.result.structured_content == {"result": 5}
    assert outcome.duration_ms > 0
    assert heartbeats and heartbeats[0] == ("tool t__add",)

    outcome = await env.run(activities.call_tool, request("fn__boom", x=1))
    assert outcome.result.is_error and outcome.result.text == "Error: boom"

    for refused in ("t__slow", "elsewhere__add", "fnshout", "down__anything"):
        with pytest.raises(ApplicationError) as err:
            await env.run(activities.call_tool, request(refused))
        assert err.value.type == "ToolNotAllowed" and err.value.non_retryable
        assert refused in str(err.value)


@pytest.mark.slow
async def test_call_tool_activity_truncates_large_results(
    activities: ToolActivities, env: ActivityEnvironment
) -> None:
    request = ToolCallRequest(
        agent="everything", call_id="c", name="t__big", arguments={"n_bytes": 5_000_000}
    )
    outcome = await env.run(activities.call_tool, request)
    assert json_size(outcome.result) <= LIMIT
    body, note = outcome.result.content
    assert isinstance(body, TextContent) and isinstance(note, TextContent)
    assert "0123456789abcdef".startswith(body.text[:16]) and len(body.text) > LIMIT - 1000
    # The server sends the text twice (content and structuredContent), hence > 10 MB.
    assert note.text.startswith("[turnkeep: tool result truncated from 10,0")
    assert note.text.endswith(" to 262,144 bytes; dropped structuredContent]")


# --- truncation --------------------------------------------------------------------------------


def text_result(*texts: str, **extra: Any) -> CallToolResult:
    return CallToolResult(content=[TextContent(text=t) for t in texts], **extra)


def test_small_results_are_untouched() -> None:
    result = text_result("hello", structured_content={"a": 1})
    assert truncate_result(result, LIMIT) is result


def test_five_megabyte_text_is_cut_to_the_limit() -> None:
    text = "x" * 5_000_000
    size = json_size(text_result(text))
    cut = truncate_result(text_result(text), LIMIT)
    assert json_size(cut) <= LIMIT
    body, note = cut.content
    assert isinstance(body, TextContent) and isinstance(note, TextContent)
    assert text.startswith(body.text) and len(body.text) > LIMIT - 200
    assert note.text == f"[turnkeep: tool result truncated from {size:,} to 262,144 bytes]"
    assert size > 5_000_000


@pytest.mark.parametrize("unit", ['"', "é", "\n", "✓", "\U0001f600", "\x01"])
def test_escapes_and_multibyte_text_stay_within_the_limit(unit: str) -> None:
    cut = truncate_result(text_result(unit * 400_000), 10_000)
    assert json_size(cut) <= 10_000
    assert json_size(cut) > 9_000  # cut close to the limit, not far below it
    assert set(cut.content[0].text) == {unit}  # type: ignore[union-attr]


def test_blocks_that_do_not_fit_are_dropped_and_counted() -> None:
    image = ImageContent(data="A" * 50_000, mime_type="image/png")
    result = CallToolResult(
        content=[TextContent(text="intro"), image, TextContent(text="y" * 50_000)],
        is_error=True,
    )
    cut = truncate_result(result, 20_000)
    assert json_size(cut) <= 20_000
    assert cut.is_error
    intro, rest, note = cut.content
    assert intro == TextContent(text="intro")
    assert isinstance(rest, TextContent) and rest.text == "y" * len(rest.text)
    assert isinstance(note, TextContent)
    assert note.text.endswith(" to 20,000 bytes; dropped 1 content block]")


def test_lone_surrogates_do_not_break_measuring_or_output() -> None:
    cut = truncate_result(text_result("a\ud800" * 100_000), 1_000)
    assert json_size(cut) <= 1_000
    for block in cut.content:
        assert isinstance(block, TextContent)
        block.text.encode("utf-8")  # strict: the payload converter must be able to write it
    assert cut.model_dump_json()


def test_wire_conversion_keeps_meta_and_drops_protocol_fields() -> None:
    raw = mcp.types.CallToolResult(
        content=[mcp.types.TextContent(type="text", text="ok\ud800")],
        structured_content={"k": "v"},
        is_error=False,
        _meta={"trace": "abc"},
    )
    wire = to_wire_result(raw)
    dumped = wire.model_dump(mode="json")
    assert dumped["content"] == [{"type": "text", "text": "ok?"}]
    assert dumped["structuredContent"] == {"k": "v"}
    assert dumped["_meta"] == {"trace": "abc"}
    assert "resultType" not in dumped
