"""The MCP door inside the HTTP gateway (``/mcp``, ``turnkeep.doors.gateway.mcp``), called with
the ``mcp`` SDK's streamable HTTP client and a bearer key, against the real dev server, a
worker and the fake model API: each key sees and reaches only its agents' tools and turns,
decides only with ``decide: true``, and keeps its own shared sessions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

from tests.conftest import HarnessFactory, eventually, make_settings
from tests.test_gateway import start_command
from turnkeep.client.turns import get_turn
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.doors.gateway import gateway_app
from turnkeep.doors.mcp_server import TOOL_NAMES
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.testing.fake_api import FakeModelApi, Reply

pytestmark = pytest.mark.asyncio

PROVIDER_KEY = "sk-turnkeep-mcpgw-91c2"  # never in a log line
ADMIN = "mcpgw-admin-key-0123456789abcdef"  # every agent, decides
READER = "mcpgw-reader-key-0123456789abcdef"  # agent `test` only, may not decide
OTHER = "mcpgw-other-key-0123456789abcdef"  # agent `other` only
NOBODY = "mcpgw-nobody-key-0123456789abcdef"  # no agent of this config
KEYS = {
    "admin": {"key": ADMIN, "agents": ["*"], "decide": True},
    "reader": {"key": READER, "agents": ["test"]},
    "other": {"key": OTHER, "agents": ["other"]},
    "nobody": {"key": NOBODY, "agents": ["ghost"]},
}
written: list[str] = []


def write(text: str) -> str:
    """Writes ``text``."""
    written.append(text)
    return f"wrote {text}"


def config(fake: FakeModelApi) -> dict[str, Any]:
    return {
        "openai": {"api_key": PROVIDER_KEY, "base_url": fake.base_url_openai},
        "agents": {
            "test": {
                "model": "openai.test-model",
                "servers": ["fs"],
                "description": "Writes things down.",
                "approval": {"tools": ["fs__write"]},
            },
            "other": {"model": "openai.other-model"},
        },
    }


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def text(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def refused(result: CallToolResult) -> str:
    assert result.is_error, result
    return text(result)


@contextlib.asynccontextmanager
async def mcp_as(url: str, key: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=bearer(key), timeout=httpx2.Timeout(60), trust_env=False) as h,
        Client(streamable_http_client(url, http_client=h)) as mcp,  # type: ignore[arg-type]
    ):
        yield mcp


async def test_mcp_behind_the_gateway_keys(
    fake: FakeModelApi, harness: HarnessFactory, caplog: pytest.LogCaptureFixture
) -> None:
    written.clear()
    fake.script(Reply.text("Noted."), model="test-model")
    fake.script(Reply.text("You have said nothing yet."), model="test-model")
    fake.script(
        Reply.tool_calls(("w1", "fs__write", {"text": "draft"})),
        Reply.text("Written."),
        model="test-model",
    )
    fake.script(Reply.text("Hello from other."), model="other-model")
    async with harness({"fs": [write]}, **config(fake)) as h:
        settings = h.settings.model_copy(
            update={"gateway": type(h.settings.gateway).model_validate({"keys": KEYS})}
        )
        # One queue for every agent (the harness's worker): a turn's agent is read from the
        # turn itself, not from its queue.
        app = gateway_app(h.client, settings, task_queue=h.task_queue, web=None, a2a=False)
        server = AsgiServer(app, name="gateway")
        async with app.router.lifespan_context(app):
            base = http_url("127.0.0.1", await server.start(bind("127.0.0.1", 0)))
            url = f"{base}/mcp"
            try:
                async with httpx2.AsyncClient(timeout=30, trust_env=False) as http:
                    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
                    anonymous = await http.post(url, json=hello)
                    wrong = await http.post(url, json=hello, headers=bearer("nope" * 8))
                    nobody = await http.post(url, json=hello, headers=bearer(NOBODY))
                    big = await http.post(
                        url, content=b"x" * (settings.gateway.max_body_bytes + 1),
                        headers=bearer(READER),
                    )  # fmt: skip
                async with mcp_as(url, READER) as reader:
                    tools = {t.name: t for t in (await reader.list_tools()).tools}
                    instructions = reader.instructions or ""
                    # A call answers with the turn's final text (a message of the key's session).
                    noted = await reader.call_tool("test", {"message": "My secret is 42."})
                    # What another agent's tool and turns are to this key: unknown, as a
                    # name no agent has.
                    other_tool = await reader.call_tool("other", {"message": "hi"})
                    ghost_tool = await reader.call_tool("ghost", {"message": "hi"})
                    start_other = await reader.call_tool(
                        "turnkeep_start", {"agent": "other", "message": "hi"}
                    )
                    start_ghost = await reader.call_tool(
                        "turnkeep_start", {"agent": "ghost", "message": "hi"}
                    )
                async with mcp_as(url, OTHER) as other:
                    started = await other.call_tool(
                        "turnkeep_start", {"agent": "other", "message": "Say hello."}
                    )
                    other_turn = started.structured_content["turn_id"]  # type: ignore[index]
                    done = await other.call_tool(
                        "turnkeep_status", {"turn_id": other_turn, "wait_seconds": 30}
                    )
                async with mcp_as(url, ADMIN) as admin:
                    admin_tools = {t.name for t in (await admin.list_tools()).tools}
                    # The admin key's shared session is its own: the reader's message is not in it.
                    fresh = await admin.call_tool("test", {"message": "What did I say?"})
                async with mcp_as(url, READER) as reader:
                    of_other = {
                        tool: await reader.call_tool(tool, {"turn_id": other_turn})
                        for tool in ("turnkeep_status", "turnkeep_cancel", "turnkeep_pending")
                    }
                    nowhere = await reader.call_tool("turnkeep_status", {"turn_id": "turn-nope"})
                    begun = await reader.call_tool(
                        "turnkeep_start", {"agent": "test", "message": "Write a draft."}
                    )
                    turn_id = begun.structured_content["turn_id"]  # type: ignore[index]

                    async def waiting() -> list[dict[str, Any]]:
                        answer = await reader.call_tool("turnkeep_pending", {})
                        return answer.structured_content["approvals"]  # type: ignore[index,no-any-return]

                    [call] = await eventually(waiting, "the write call awaits approval")
                    undecided = await reader.call_tool(
                        "turnkeep_decide", {"turn_id": turn_id, "call_id": "w1", "approve": True}
                    )
                async with mcp_as(url, OTHER) as other:
                    # The other key sees no waiting call of `test`, and cannot decide it.
                    others_pending = await other.call_tool("turnkeep_pending", {})
                    others_decide = await other.call_tool(
                        "turnkeep_decide", {"turn_id": turn_id, "call_id": "w1", "approve": True}
                    )
                async with mcp_as(url, ADMIN) as admin:
                    decided = await admin.call_tool(
                        "turnkeep_decide",
                        {"turn_id": turn_id, "call_id": "w1", "approve": True, "reason": "ok"},
                    )
                    finished = await admin.call_tool(
                        "turnkeep_status", {"turn_id": turn_id, "wait_seconds": 30}
                    )
            finally:
                await app.state.gateway.hub.aclose()
                await server.stop()
        result = await get_turn(h.client, turn_id).result()

    for response in (anonymous, wrong):
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert response.json() == {
            "error": "a valid API key is required: Authorization: Bearer <key>"
        }
    assert nobody.status_code == 403
    assert big.status_code == 413
    # The reader key: its agent's tool and the turn tools, nothing naming the other agent.
    assert set(tools) == {"test", *TOOL_NAMES}
    assert tools["turnkeep_start"].input_schema["properties"]["agent"]["description"] == (
        "One of: test."
    )
    assert "`test`" in instructions and "other" not in instructions
    assert admin_tools == {"test", "other", *TOOL_NAMES}
    assert text(noted) == "Noted." and not noted.is_error
    assert refused(other_tool) == refused(ghost_tool).replace("ghost", "other")
    assert (
        refused(start_other)
        == refused(start_ghost).replace("ghost", "other")
        == "unknown agent 'other': this server serves test; nothing was started"
    )
    assert done.structured_content["text"] == "Hello from other."  # type: ignore[index]
    for tool, answer in of_other.items():
        assert refused(answer) == refused(nowhere).replace("turn-nope", other_turn), tool
    asked = [r.body["messages"] for r in fake.requests_for_model("test-model")]
    assert [m["content"] for m in asked[1] if m["role"] == "user"] == ["What did I say?"]
    assert text(fresh) == "You have said nothing yet."
    # Deciding: the reader may not, the other key does not see the turn, the admin may.
    assert call["turn_id"] == turn_id and call["call_id"] == "w1"
    assert refused(undecided) == "this caller may not decide tool calls"
    assert others_pending.structured_content == {"approvals": []}
    assert refused(others_decide) == "this caller may not decide tool calls"
    assert decided.structured_content["by"] == "gateway key admin via mcp"  # type: ignore[index]
    assert finished.structured_content["text"] == "Written."  # type: ignore[index]
    assert [(d.call_id, d.by) for d in result.decisions] == [("w1", "gateway key admin via mcp")]
    assert written == ["draft"]
    # No key, the callers' or the provider's, in any log line.
    assert not any(k in caplog.text for k in (ADMIN, READER, OTHER, NOBODY, PROVIDER_KEY))


async def test_mcp_off_and_a_lifespan_not_run(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        agents={"test": {"model": "passthrough"}},
        gateway={"keys": {"admin": {"key": ADMIN, "agents": ["*"], "decide": True}}},
    )
    fake_client: Any = object()  # nothing reaches Temporal here
    for mcp in (False, True):
        app = gateway_app(fake_client, settings, web=None, a2a=False, mcp=mcp)
        server = AsgiServer(app, name="gateway")  # no lifespan run
        base = http_url("127.0.0.1", await server.start(bind("127.0.0.1", 0)))
        try:
            async with httpx2.AsyncClient(timeout=10, trust_env=False) as http:
                hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
                anonymous = await http.post(f"{base}/mcp", json=hello)
                keyed = await http.post(f"{base}/mcp", json=hello, headers=bearer(ADMIN))
        finally:
            await server.stop()
        assert anonymous.status_code == 401
        assert keyed.status_code == (503 if mcp else 404), keyed.text


async def test_an_mcp_session_is_only_its_keys(tmp_path: Path) -> None:
    """A handshake-era session (``Mcp-Session-Id``) opened with one key is unknown to another,
    even one with the same scope."""
    second = "mcpgw-second-key-0123456789abcdef"
    settings = make_settings(
        tmp_path,
        agents={"test": {"model": "passthrough"}},
        gateway={
            "keys": {
                "admin": {"key": ADMIN, "agents": ["*"]},
                "second": {"key": second, "agents": ["*"]},
            }
        },
    )
    fake_client: Any = object()  # listing tools reaches no Temporal
    app = gateway_app(fake_client, settings, web=None, a2a=False)
    server = AsgiServer(app, name="gateway")
    headers = {"accept": "application/json, text/event-stream"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    async with app.router.lifespan_context(app):
        base = http_url("127.0.0.1", await server.start(bind("127.0.0.1", 0)))
        try:
            async with httpx2.AsyncClient(timeout=10, trust_env=False) as http:
                opened = await http.post(
                    f"{base}/mcp", json=initialize, headers={**headers, **bearer(ADMIN)}
                )
                session = {
                    **headers,
                    "mcp-session-id": opened.headers["mcp-session-id"],
                    "mcp-protocol-version": "2025-06-18",
                }
                own = await http.post(
                    f"{base}/mcp", json=listing, headers={**session, **bearer(ADMIN)}
                )
                other = await http.post(
                    f"{base}/mcp", json=listing, headers={**session, **bearer(second)}
                )
        finally:
            await server.stop()
    assert opened.status_code == 200 and own.status_code == 200 and '"test"' in own.text
    assert other.status_code == 404 and "Session not found" in other.text


async def test_the_command_serves_mcp_behind_its_keys_and_logs_no_key(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    config = tmp_path / "turnkeep.yaml"
    config.write_text(
        f"task_queue: test-mcpgw-{uuid.uuid4().hex[:8]}\n"
        "agents: {echo: {model: passthrough}}\n"
        "gateway: {keys: {ops: {key: '${OPS_KEY}', agents: ['*']}}}\n",
        encoding="utf-8",
    )
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.address, "OPS_KEY": ADMIN}
    log = tmp_path / "gateway.log"
    process = start_command(config, port, env, log, "--worker")
    url = f"{http_url('127.0.0.1', port)}/mcp"
    try:
        async with httpx2.AsyncClient(trust_env=False) as http:

            async def up() -> bool:
                with contextlib.suppress(httpx2.TransportError):
                    return (
                        await http.get(f"{http_url('127.0.0.1', port)}/openapi.json")
                    ).is_success
                return False

            await eventually(up, "the gateway serves")
            anonymous = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        # The command ran the app's lifespan: the MCP door answers.
        async with mcp_as(url, ADMIN) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            echoed = await mcp.call_tool("echo", {"message": "Over the gateway."})
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 30)
    assert anonymous.status_code == 401
    assert names == {"echo", *TOOL_NAMES}
    assert not echoed.is_error and "Over the gateway." in text(echoed)
    assert code == 0
    output = log.read_text()
    assert "MCP at /mcp" in output and ADMIN not in output


async def test_an_agent_named_as_a_turnkeep_tool_needs_no_mcp(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        agents={"turnkeep_start": {"model": "passthrough"}},
        gateway={"keys": {"admin": {"key": ADMIN, "agents": ["*"]}}},
    )
    fake_client: Any = object()
    with pytest.raises(ValueError, match=r"one of turnkeep's MCP tools \(.*--no-mcp\)"):
        gateway_app(fake_client, settings, web=None, a2a=False)
    assert gateway_app(fake_client, settings, web=None, a2a=False, mcp=False).state.mcp is None
