"""Function tools called in process (``call_function_tool``) answer exactly as they did through
an in-memory MCP session: every result and listing is compared with what a real ``fastmcp``
client of the same server receives. Plus cancellation, the idempotency key for tools that take a
``Context``, and a tool that calls ``sys.exit``."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import mcp.types
import pytest
from fastmcp import Client, Context, FastMCP
from fastmcp.client.transports import FastMCPTransport
from fastmcp.utilities.types import Image
from pydantic import BaseModel

from tests.conftest import eventually
from turnkeep.activities.tools import IDEMPOTENCY_KEY_META, to_wire_result
from turnkeep.config.settings import Settings
from turnkeep.tools.function_tools import (
    build_function_server,
    call_function_tool,
    list_function_tools,
)
from turnkeep.tools.registry import ToolServers
from turnkeep.tools.source import ServerUnavailable

# --- the tools ---------------------------------------------------------------------------------


class Point(BaseModel):
    x: int
    y: int = 0


def shout(text: str, times: int = 1) -> str:
    """Upper-case the text, repeated."""
    return " ".join([text.upper()] * times)


async def whisper(text: str) -> str:
    """Lower-case the text."""
    await asyncio.sleep(0)
    return text.lower()


def point(x: int, y: int = 0) -> Point:
    """A typed (pydantic) return: structured content with an object schema."""
    return Point(x=x, y=y)


async def tally(words: list[str]) -> dict[str, int]:
    return {w: words.count(w) for w in words}


def numbers(n: int) -> list[int]:
    """A non-object return: text only (FastMCP's ``{"result": ...}`` wrap is left out)."""
    return list(range(n))


def nothing() -> None:
    return None


def picture() -> Image:
    return Image(data=b"\x89PNG\r\n\x1a\n", format="png")


def boom(x: int) -> str:
    raise ValueError(f"boom {x}")


async def aboom() -> str:
    raise RuntimeError("async boom")


def leave() -> str:
    sys.exit(3)


tasks_seen: list[asyncio.Task[Any] | None] = []


async def where() -> str:
    tasks_seen.append(asyncio.current_task())
    return "here"


events: list[str] = []


async def hang(tag: str) -> str:
    """Wait for an event that never comes; record being cancelled."""
    events.append(f"started {tag}")
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        events.append(f"cancelled {tag}")
        raise
    return "never"


release = threading.Event()


def block(tag: str) -> str:
    """A sync tool holding its worker thread until the test releases it."""
    events.append(f"started {tag}")
    release.wait(60)
    events.append(f"finished {tag}")
    return "released"


def keyed(tag: str, ctx: Context) -> str:
    """Say which idempotency key this call was given."""
    meta = ctx.request_context.meta if ctx.request_context else None
    return f"{tag}: {(meta or {}).get(IDEMPOTENCY_KEY_META)}"


TOOLS: list[Callable[..., Any]] = [
    shout,
    whisper,
    point,
    tally,
    numbers,
    nothing,
    picture,
    boom,
    aboom,
    leave,
    where,
    hang,
    block,
    keyed,
]

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("shout", {"text": "hey", "times": 2}),
    ("shout", {"text": "x" * 5000}),
    ("whisper", {"text": "HEY"}),
    ("point", {"x": 1, "y": 2}),
    ("tally", {"words": ["a", "b", "a"]}),
    ("numbers", {"n": 3}),
    ("nothing", {}),
    ("picture", {}),
    ("boom", {"x": 1}),
    ("aboom", {}),
    ("leave", {}),
    ("shout", {"text": "hey", "times": "twice"}),  # wrong type
    ("shout", {}),  # missing a required argument
    ("point", {"x": 1, "z": 2}),  # an argument the tool does not take
    ("nope", {}),  # unknown tool
]


@pytest.fixture(autouse=True)
def fresh_state() -> None:
    tasks_seen.clear()
    events.clear()
    release.clear()


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[ToolServers]:
    settings = Settings.model_validate(
        {"base_dir": tmp_path, "function_tools": {"broken": ["no_such_mod:f"]}}
    )
    async with ToolServers(settings, {"fn": TOOLS}) as pool:
        yield pool
    release.set()  # let a test's blocked thread end


@pytest.fixture
async def server_and_client() -> AsyncIterator[tuple[FastMCP, Client[Any]]]:
    """A function-tool server and an MCP client of it, as the pool used to call it."""
    server = build_function_server("fn", TOOLS)
    async with Client(FastMCPTransport(server)) as client:
        yield server, client


def dump(value: mcp.types.CallToolResult | mcp.types.Tool) -> dict[str, Any]:
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- the same answers as over MCP ------------------------------------------------------------


async def test_direct_calls_answer_what_an_mcp_client_receives(
    server_and_client: tuple[FastMCP, Client[Any]], pool: ToolServers
) -> None:
    server, client = server_and_client
    meta = {IDEMPOTENCY_KEY_META: "wf/c1"}
    for name, arguments in CALLS:
        over_mcp = dump(await client.call_tool_mcp(name, arguments, meta=meta))
        direct = dump(await call_function_tool(server, name, arguments))
        pooled = dump(await pool.call_tool("fn", name, arguments, meta=meta))
        assert direct == over_mcp, (name, arguments)
        assert pooled == over_mcp, (name, arguments)

    # The comparison covers what matters: errors are results the model reads.
    async def text(name: str, **arguments: Any) -> tuple[bool, str]:
        result = to_wire_result(await pool.call_tool("fn", name, arguments))
        return result.is_error, result.text

    assert await text("boom", x=1) == (True, "Error: boom 1")
    assert await text("aboom") == (True, "Error: async boom")
    assert await text("leave") == (True, "Error: the tool called sys.exit(3)")
    assert await text("nope") == (True, "Unknown tool: 'nope'")
    is_error, message = await text("shout", text="hey", times="twice")
    assert is_error and "times" in message
    is_error, message = await text("shout")
    assert is_error and "Missing required argument" in message
    structured = await pool.call_tool("fn", "point", {"x": 1, "y": 2})
    assert structured.structured_content == {"x": 1, "y": 2}


async def test_listing_matches_what_an_mcp_client_lists(
    server_and_client: tuple[FastMCP, Client[Any]], pool: ToolServers
) -> None:
    server, client = server_and_client
    over_mcp = [dump(tool) for tool in await client.list_tools()]
    assert [t["name"] for t in over_mcp] == [fn.__name__ for fn in TOOLS]
    assert [dump(tool) for tool in await list_function_tools(server)] == over_mcp
    assert [dump(tool) for tool in await pool.list_tools("fn")] == over_mcp


async def test_a_function_tool_is_looked_up_once(
    pool: ToolServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[str] = []
    get_tool = FastMCP.get_tool

    async def count(self: FastMCP, name: str, version: Any = None) -> Any:
        looked_up.append(name)
        return await get_tool(self, name, version)

    monkeypatch.setattr(FastMCP, "get_tool", count)
    for times in (1, 2, 3):
        shouted = await pool.call_tool("fn", "shout", {"text": "hey", "times": times})
        assert to_wire_result(shouted).text == " ".join(["HEY"] * times)
    assert looked_up == ["shout"]
    # An unknown tool is looked up every time, and answered as before.
    for _ in range(2):
        missing = await pool.call_tool("fn", "nope", {})
        assert missing.is_error and to_wire_result(missing).text == "Unknown tool: 'nope'"
    assert looked_up == ["shout", "nope", "nope"]


async def test_a_function_server_is_listed_once(
    pool: ToolServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await pool.list_tools("fn")
    listed: list[str] = []

    async def count(self: FastMCP, *args: Any, **kwargs: Any) -> Any:
        listed.append(self.name)
        return []

    monkeypatch.setattr(FastMCP, "list_tools", count)
    assert [dump(tool) for tool in await pool.list_tools("fn")] == [dump(t) for t in first]
    assert listed == []


async def test_a_plain_value_is_given_once_as_text(pool: ToolServers) -> None:
    # FastMCP's default would add structured content {"result": ...} (and an output schema
    # saying so) to a non-object return, doubling it in history; an object keeps its own.
    shouted = await pool.call_tool("fn", "shout", {"text": "hey", "times": 2})
    assert dump(shouted)["content"] == [{"type": "text", "text": "HEY HEY"}]
    assert shouted.structured_content is None and not (shouted.meta or {}).get("fastmcp")
    listed = await pool.call_tool("fn", "numbers", {"n": 3})
    assert to_wire_result(listed).text == "[0,1,2]" and listed.structured_content is None
    schemas = {tool.name: tool.output_schema for tool in await pool.list_tools("fn")}
    assert schemas["shout"] is None and schemas["numbers"] is None
    assert schemas["point"] is not None and "x-fastmcp-wrap-result" not in schemas["point"]
    point_ = await pool.call_tool("fn", "point", {"x": 1})
    assert point_.structured_content == {"x": 1, "y": 0}


async def test_the_pool_runs_function_tools_in_the_calling_task(pool: ToolServers) -> None:
    assert to_wire_result(await pool.call_tool("fn", "where", {})).text == "here"
    # Over an in-memory MCP session the tool would run in the server's request task.
    assert tasks_seen == [asyncio.current_task()]


# --- cancellation ------------------------------------------------------------------------------


async def test_cancelling_the_caller_cancels_an_async_tool(pool: ToolServers) -> None:
    call = asyncio.create_task(pool.call_tool("fn", "hang", {"tag": "a"}))
    await eventually(lambda: "started a" in events, "the tool started")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # The tool's coroutine was cancelled as part of the caller unwinding, not later.
    assert events == ["started a", "cancelled a"]


async def test_cancelling_the_caller_releases_it_from_a_sync_tool(pool: ToolServers) -> None:
    call = asyncio.create_task(pool.call_tool("fn", "block", {"tag": "b"}))
    await eventually(lambda: "started b" in events, "the tool started")
    call.cancel()
    # The caller is released at once (a hang would end in TimeoutError, not CancelledError);
    # the thread keeps running until the test releases it, then its result is dropped.
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, timeout=30)
    assert events == ["started b"]
    release.set()
    await eventually(lambda: "finished b" in events, "the abandoned thread ran to its end")
    assert to_wire_result(await pool.call_tool("fn", "block", {"tag": "c"})).text == "released"


# --- the idempotency key and failures to open ---------------------------------------------------


async def test_a_tool_taking_a_context_is_told_the_idempotency_key(pool: ToolServers) -> None:
    result = await pool.call_tool("fn", "keyed", {"tag": "x"}, meta={IDEMPOTENCY_KEY_META: "w/c"})
    assert to_wire_result(result).text == "x: w/c"


async def test_a_function_server_that_cannot_be_built_is_unavailable(pool: ToolServers) -> None:
    for attempt in (pool.call_tool("broken", "f", {}), pool.list_tools("broken")):
        with pytest.raises(ServerUnavailable) as err:
            await attempt
        assert str(err.value).startswith(
            "MCP server 'broken' (function tools) could not be started: "
        )
        assert "no_such_mod" in str(err.value)
