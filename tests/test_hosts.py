"""DNS-rebinding protection on every HTTP door (``turnkeep.doors.hosts``): ``turnkeep serve``'s
streamable HTTP and the gateway (its API, ``/mcp``, A2A and the web page), each on a real
loopback socket. A request naming another Host, or sent by a page of another Origin, is
refused with a 4xx before anything runs (no turn starts); loopback names and origins, the
request's own origin and the configured ``allowed_hosts`` / ``allowed_origins`` are answered."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import typer
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send
from temporalio.client import Client as TemporalClient

from tests.conftest import HarnessFactory, eventually, make_settings
from turnkeep.cli.options import extended
from turnkeep.config.settings import GatewaySettings, ServeSettings, Settings
from turnkeep.contract.turn_io import agent_task_queue
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.doors.gateway import gateway_app
from turnkeep.doors.hosts import HostOriginGuard
from turnkeep.doors.mcp_server import McpDoor
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.worker.build import build_workers

pytestmark = pytest.mark.asyncio

EVIL_HOST = {"host": "evil.example.com"}
EVIL_ORIGIN = {"origin": "http://evil.example.com"}
KEY = "hosts-admin-key-0123456789abcdef"
PASSTHROUGH = {"agents": {"test": {"model": "passthrough", "description": "echoes"}}}


async def _hello(scope: Scope, receive: Receive, send: Send) -> None:
    await PlainTextResponse("hello")(scope, receive, send)


@contextlib.asynccontextmanager
async def guarded(host: str = "127.0.0.1", **allowed: Any) -> AsyncIterator[httpx2.AsyncClient]:
    """A trivial app behind the guard, served on ``host``."""
    server = AsgiServer(HostOriginGuard(_hello, **allowed), name="guarded")
    port = await server.start(bind(host, 0))
    try:
        async with httpx2.AsyncClient(base_url=http_url(host, port), trust_env=False) as http:
            yield http
    finally:
        await server.stop()


async def test_the_rules_on_a_loopback_server() -> None:
    async with guarded(allowed_hosts=["gw.example.com"], allowed_origins=["https://app.test"]) as h:
        port = h.base_url.port

        async def status(**headers: str) -> int:
            return (await h.get("/", headers=headers)).status_code

        # Loopback names, with or without a port; a configured name; nothing else.
        for host in ("localhost", f"localhost:{port}", "127.0.0.1:1", "[::1]:8000", "[::1]"):
            assert await status(host=host) == 200, host
        assert await status(host="gw.example.com:8080") == 200
        assert await status(host="evil.example.com") == 421
        assert await status(host=f"evil.example.com:{port}") == 421
        assert await status(host="gw.example.com.evil.test") == 421
        # No Origin (a client that is no browser), loopback origins, the request's own origin
        # and a configured one are answered; any other page is refused.
        assert await status() == 200
        for origin in ("http://localhost:3000", "http://127.0.0.1", "http://[::1]:9"):
            assert await status(origin=origin) == 200, origin
        assert await status(host="gw.example.com", origin="http://gw.example.com") == 200
        assert await status(origin="https://app.test") == 200
        assert await status(origin="https://app.test:8443") == 403
        assert await status(origin="http://evil.example.com") == 403
        assert await status(origin="null") == 403
        refused = await h.get("/", headers=EVIL_ORIGIN)
        assert refused.json() == {
            "error": "requests from that Origin are refused (set allowed_origins to permit it)"
        }


async def test_the_rules_on_another_address() -> None:
    # A request that came in on an address that is not loopback (as ASGITransport's do): the
    # Host is the deployment's to say, unless it names some; the Origin must still be the
    # request's own or a configured one.
    app = HostOriginGuard(_hello, allowed_origins=["https://app.test"])
    hosted = HostOriginGuard(_hello, allowed_hosts=["gw.example.com"])
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://gw.example.com"
    ) as outside:
        assert (await outside.get("/")).status_code == 200
        assert (await outside.get("/", headers={"host": "any.example.com"})).status_code == 200
        same = {"origin": "https://gw.example.com"}  # behind a proxy that ends TLS
        assert (await outside.get("/", headers=same)).status_code == 200
        other = {"origin": "http://localhost:3000"}
        assert (await outside.get("/", headers=other)).status_code == 403
        assert (await outside.get("/", headers=EVIL_ORIGIN)).status_code == 403
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=hosted), base_url="http://gw.example.com"
    ) as outside:
        assert (await outside.get("/")).status_code == 200
        assert (await outside.get("/", headers={"host": "any.example.com"})).status_code == 421
        # The address the request came in on, as a probe names it.
        assert (await outside.get("/", headers={"host": "gw.example.com:8080"})).status_code == 200
    probed = HostOriginGuard(_hello, allowed_hosts=["gw.example.com"])
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=probed), base_url="http://10.1.2.3:8080"
    ) as pod:
        assert (await pod.get("/healthz")).status_code == 200
        assert (await pod.get("/", headers={"host": "evil.example.com"})).status_code == 421


async def test_the_settings_check_what_they_are_given(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        serve={"allowed_hosts": ["MCP.example.com:8000", "*.lan"], "allowed_origins": ["*"]},
        gateway={"allowed_origins": ["https://App.example.com/"]},
    )
    assert settings.serve.allowed_hosts == ["mcp.example.com:8000", "*.lan"]
    assert settings.serve.allowed_origins == ["*"]
    assert settings.gateway.allowed_origins == ["https://app.example.com"]
    with pytest.raises(ValidationError, match="is not a host"):
        Settings.model_validate({"serve": {"allowed_hosts": ["http://x.example.com"]}})
    with pytest.raises(ValidationError, match="is not a web origin"):
        Settings.model_validate({"gateway": {"allowed_origins": ["x.example.com"]}})


async def test_the_command_line_adds_to_the_config() -> None:
    block = ServeSettings(allowed_hosts=["a.example.com"])
    both = extended(block, "B.example.com:8080, *.lan", "https://app.example.com")
    assert both.allowed_hosts == ["a.example.com", "b.example.com:8080", "*.lan"]
    assert both.allowed_origins == ["https://app.example.com"]
    assert extended(block, None, None) is block
    with pytest.raises(typer.BadParameter, match="is not a host"):
        extended(block, "https://a.example.com", None)
    with pytest.raises(typer.BadParameter, match="is not a web origin"):
        extended(GatewaySettings(), None, "app.example.com")


def text(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


async def turns_on(client: TemporalClient, queue: str) -> list[str]:
    return [w.id async for w in client.list_workflows(f"TaskQueue = '{queue}'")]


async def test_serve_refuses_a_rebound_call_before_it_starts_a_turn(
    client: TemporalClient, tmp_path: Path
) -> None:
    queue = f"test-hosts-{uuid.uuid4().hex[:8]}"
    settings = make_settings(tmp_path, task_queue=queue, **PASSTHROUGH)
    # Headers put on the next requests (the tool call's, once the client is connected), and
    # the statuses answered.
    forged: dict[str, str] = {}
    statuses: list[int] = []

    async def forge(request: httpx2.Request) -> None:
        request.headers.update(forged)

    async def record(response: httpx2.Response) -> None:
        statuses.append(response.status_code)

    async with build_workers(client, settings):
        door = McpDoor(client, settings, scope="request")
        async with door.serve_http(allowed_hosts=["mcp.test"]) as url:
            hooks = {"request": [forge], "response": [record]}
            for headers, status in ((EVIL_HOST, 421), (EVIL_ORIGIN, 403)):
                async with httpx2.AsyncClient(trust_env=False, event_hooks=hooks) as http:
                    with pytest.raises(Exception):  # noqa: B017 - the SDK's, whatever it is
                        async with Client(streamable_http_client(url, http_client=http)) as mcp:
                            forged.update(headers)
                            await mcp.call_tool("test", {"message": "rebound"})
                assert statuses[-1] == status
                forged.clear()
            # The refused calls started nothing.
            assert door.turn_ids == []
            # A loopback client, and one naming the configured host, are answered.
            async with Client(url) as mcp:
                answered = await mcp.call_tool("test", {"message": "hello"})
            assert text(answered) == "hello"
            named_host = {"host": "mcp.test", "origin": "http://mcp.test"}
            async with (
                httpx2.AsyncClient(trust_env=False, headers=named_host) as http,
                Client(streamable_http_client(url, http_client=http)) as mcp,
            ):
                named = await mcp.call_tool("test", {"message": "by name"})
            assert text(named) == "by name"
    assert len(door.turn_ids) == 2

    async def both_listed() -> bool:
        return len(await turns_on(client, agent_task_queue(queue, "test"))) == 2

    await eventually(both_listed, "the two answered calls' turns are listed")


async def test_every_gateway_door_refuses_a_rebound_request_before_anything_runs(
    harness: HarnessFactory,
) -> None:
    async with harness(**PASSTHROUGH) as h:
        block = {
            "keys": {"admin": {"key": KEY, "agents": ["*"], "decide": True}},
            "allowed_hosts": ["gateway.test"],
            "allowed_origins": ["https://app.example.com"],
        }
        settings = h.settings.model_copy(
            update={"gateway": type(h.settings.gateway).model_validate(block)}
        )
        app = gateway_app(h.client, settings, task_queue=h.task_queue, a2a=True)
        server = AsgiServer(app, name="gateway")
        async with app.router.lifespan_context(app):
            base = http_url("127.0.0.1", await server.start(bind("127.0.0.1", 0)))
            try:
                async with httpx2.AsyncClient(
                    base_url=base, trust_env=False, headers={"authorization": f"Bearer {KEY}"}
                ) as http:
                    start = {"agent": "test", "prompt": "hello"}
                    a2a = {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "SendMessage",
                        "params": {
                            "message": {
                                "messageId": "m1",
                                "role": "ROLE_USER",
                                "parts": [{"text": "hello"}],
                            }
                        },
                    }
                    mcp = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
                    for headers, status in ((EVIL_HOST, 421), (EVIL_ORIGIN, 403)):
                        requests = [
                            http.post("/api/turns", json=start, headers=headers),
                            http.post("/a2a/test/", json=a2a, headers=headers),
                            http.post("/mcp", json=mcp, headers=headers),
                            http.get("/", headers=headers),  # the web page
                            http.get("/openapi.json", headers=headers),
                        ]
                        for request in requests:
                            answer = await request
                            assert answer.status_code == status, answer.request.url
                            assert "error" in answer.json()
                    # Nothing started; the same request from loopback, by the configured
                    # name, or from the configured page starts its turn.
                    assert await turns_on(h.client, h.task_queue) == []
                    started = [
                        await http.post("/api/turns", json=start),
                        await http.post("/api/turns", json=start, headers={"host": "gateway.test"}),
                        await http.post(
                            "/api/turns", json=start, headers={"origin": "https://app.example.com"}
                        ),
                    ]
                    assert [a.status_code for a in started] == [201, 201, 201]
                    # The web page's own calls: same origin as the page.
                    page = await http.get("/", headers={"origin": base})
                    assert page.status_code == 200
            finally:
                await app.state.gateway.hub.aclose()
                await server.stop()
        ids = {a.json()["turn_id"] for a in started}

        async def listed() -> bool:
            return set(await turns_on(h.client, h.task_queue)) == ids

        await eventually(listed, "exactly the three accepted turns are listed")


async def test_an_a2a_app_of_its_own_is_guarded(harness: HarnessFactory) -> None:
    from turnkeep.doors.a2a import a2a_app

    async with harness(**PASSTHROUGH) as h:
        app = a2a_app(h.client, h.settings, task_queue=h.task_queue, allowed_hosts=["a2a.test"])
        server = AsgiServer(app, name="a2a")
        base = http_url("127.0.0.1", await server.start(bind("127.0.0.1", 0)))
        try:
            async with httpx2.AsyncClient(base_url=base, trust_env=False) as http:
                card = "/a2a/test/.well-known/agent-card.json"
                assert (await http.get(card, headers=EVIL_HOST)).status_code == 421
                assert (await http.get(card, headers=EVIL_ORIGIN)).status_code == 403
                assert (await http.get(card)).json()["name"] == "test"
                named = await http.get(card, headers={"host": "a2a.test"})
                assert named.status_code == 200
        finally:
            await server.stop()


async def test_serve_takes_more_hosts_on_its_command_line(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    config = tmp_path / "turnkeep.yaml"
    config.write_text(
        "agents: {test: {model: passthrough}}\nserve: {allowed_hosts: [from-config.test]}\n",
        encoding="utf-8",
    )
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    argv = [
        *(sys.executable, "-m", "turnkeep.cli", "serve", "--port", str(port), "--config"),
        *(str(config), "--address", temporal.address, "--worker"),
        *("--allowed-hosts", "from-flag.test", "--allowed-origins", "https://app.test"),
    ]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=tmp_path, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
    try:
        async with httpx2.AsyncClient(
            base_url=http_url("127.0.0.1", port), trust_env=False
        ) as http:

            async def status(**headers: str) -> int | None:
                with contextlib.suppress(httpx2.TransportError):
                    return (await http.get("/mcp", headers=headers)).status_code
                return None

            await eventually(status, "the server serves", within=120)
            assert await status(**EVIL_HOST) == 421
            # Any answer but a refusal: the request went on to the MCP endpoint.
            assert await status(host="from-config.test") not in (421, 403)
            assert await status(host="from-flag.test") not in (421, 403)
            assert await status(origin="https://app.test") not in (421, 403)
            assert await status(**EVIL_ORIGIN) == 403
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)
