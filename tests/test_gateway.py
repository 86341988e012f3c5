"""The HTTP gateway (``turnkeep gateway``, issue #34) against the real dev server, a real
worker and the fake model API, through a real socket with httpx: turns, sessions, approvals
and their server-sent events, each bad request's one-line 4xx, and the OpenAPI document."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette

from tests.conftest import Harness, HarnessFactory, eventually, write_script
from turnkeep.doors.gateway import gateway_app
from turnkeep.doors.gateway.openapi import openapi_document
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.testing.fake_api import Answer, FakeModelApi, Reply

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parent.parent
OPENAPI = ROOT / "docs" / "serving" / "openapi.json"

ADMIN = "gw-admin-key-0123456789abcdef"  # every agent, decides
READER = "gw-reader-key-0123456789abcdef"  # agent `test` only, may not decide
OTHER = "gw-other-key-0123456789abcdef"  # agent `other` only
WRONG = "gw-wrong-key-0123456789abcdef"
KEYS = {
    "admin": {"key": ADMIN, "agents": ["*"], "decide": True},
    "reader": {"key": READER, "agents": ["test"]},
    "other": {"key": OTHER, "agents": ["other"]},
}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


gate = asyncio.Event()


async def blocked(name: str) -> str:
    """A slow tool: runs until the test opens the gate."""
    await gate.wait()
    return f"{name} passed"


def look(name: str) -> str:
    """Reads ``name``."""
    return f"read {name}"


SLOW_CALL = '***CALL_TOOL local__blocked {"name": "slow"}'


@pytest.fixture(autouse=True)
def _reset() -> None:
    gate.clear()


@contextlib.asynccontextmanager
async def served(app: Starlette) -> AsyncIterator[httpx2.AsyncClient]:
    server = AsgiServer(app, name="gateway")
    port = await server.start(bind("127.0.0.1", 0))
    try:
        async with httpx2.AsyncClient(
            base_url=http_url("127.0.0.1", port), timeout=httpx2.Timeout(60), trust_env=False
        ) as http:
            yield http
    finally:
        await app.state.gateway.hub.aclose()
        await server.stop()


@contextlib.asynccontextmanager
async def gateway(h: Harness, **gateway: Any) -> AsyncIterator[httpx2.AsyncClient]:
    settings = h.settings.model_copy(
        update={"gateway": type(h.settings.gateway).model_validate({"keys": KEYS, **gateway})}
    )
    async with served(gateway_app(h.client, settings, task_queue=h.task_queue)) as http:
        yield http


Events = list[tuple[str, Any, str | None]]


async def events(
    http: httpx2.AsyncClient,
    path: str,
    key: str = ADMIN,
    sink: Events | None = None,
    **headers: str,
) -> Events:
    """Every event of a stream, until it closes: (event, data, id)."""
    got: Events = [] if sink is None else sink
    async with http.sse(path, headers={**bearer(key), **headers}) as source:
        assert source.response.status_code == 200, await source.response.aread()
        async for event in source:
            got.append((event.event, json.loads(event.data), event.id or None))
    return got


def messages(got: list[tuple[str, Any, str | None]]) -> list[dict[str, Any]]:
    return [data for name, data, _ in got if name == "message"]


PASSTHROUGH = {
    "agents": {
        "test": {"model": "passthrough", "servers": ["local"], "description": "echoes"},
        "other": {"model": "passthrough"},
    }
}


async def test_a_turn_started_streamed_to_many_watchers_and_read(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    held = threading.Event()
    fake.script(Answer(text="Hello there, watcher.", hold=held), api="anthropic")
    config = {
        "anthropic": {"api_key": "sk-test-0123456789", "base_url": fake.base_url_anthropic},
        "agents": {"test": {"model": "anthropic.test-model"}},
        "streaming": {"listen": "127.0.0.1:0"},
    }
    async with harness(**config) as h, gateway(h) as http:
        started = await http.post(
            "/api/turns", json={"agent": "test", "prompt": "hi"}, headers=bearer(ADMIN)
        )
        assert started.status_code == 201, started.text
        turn_id = started.json()["turn_id"]
        sinks: list[Events] = [[] for _ in range(20)]
        path = f"/api/turns/{turn_id}/events"
        watchers = [asyncio.ensure_future(events(http, path, sink=sink)) for sink in sinks]
        # The model's last chunk waits until a watcher has some of its text.
        await eventually(lambda: any(e[0] == "text" for e in sinks[0]), "live text")
        held.set()
        streams = await asyncio.gather(*watchers)
        assert all(s == streams[0] for s in streams)
        got = streams[0]
        assert [m["message"]["role"] for m in messages(got)] == ["user", "assistant"]
        assert "".join(d["text"] for n, d, _ in got if n == "text") == "Hello there, watcher."
        assert got[-1][:2] == ("end", {"status": "completed", "error": None})
        assert [i for n, _, i in got if n == "message"] == ["0", "1"]
        state = (await http.get(f"/api/turns/{turn_id}", headers=bearer(READER))).json()
        assert state["status"] == "completed"
        assert state["result"]["messages"][-1]["content"][0]["text"] == "Hello there, watcher."
        # Resumed after message 0: only the answer, and the end.
        again = await events(http, f"/api/turns/{turn_id}/events?after=0")
        assert [m["index"] for m in messages(again)] == [1]
