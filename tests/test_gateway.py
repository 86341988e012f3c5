"""The HTTP gateway (``turnkeep gateway``, issue #34) against the real dev server, a real
worker and the fake model API, through a real socket with httpx: turns, sessions, approvals
and their server-sent events, each bad request's one-line 4xx, and the OpenAPI document."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import jsonschema
import pytest
from starlette.applications import Starlette
from temporalio.service import RPCError, RPCStatusCode

from tests.conftest import Harness, HarnessFactory, eventually, turnkeep, write_script
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.doors.gateway import gateway_app
from turnkeep.doors.gateway.fanout import Event, Watcher
from turnkeep.doors.gateway.openapi import openapi_document
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.testing.fake_api import Answer, FakeModelApi

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


async def started_turn(http: httpx2.AsyncClient, prompt: str, agent: str = "test") -> str:
    answer = await http.post(
        "/api/turns", json={"agent": agent, "prompt": prompt}, headers=bearer(ADMIN)
    )
    assert answer.status_code == 201, answer.text
    turn_id: str = answer.json()["turn_id"]
    return turn_id


async def test_a_turn_cancelled(harness: HarnessFactory) -> None:
    async with harness({"local": [blocked]}, **PASSTHROUGH) as h, gateway(h) as http:
        turn_id = await started_turn(http, SLOW_CALL)
        seen: Events = []
        watcher = asyncio.ensure_future(events(http, f"/api/turns/{turn_id}/events", sink=seen))
        # The tool call is out: the turn runs its slow tool.
        await eventually(lambda: len(messages(seen)) >= 2, "the tool call message")
        state = (await http.get(f"/api/turns/{turn_id}", headers=bearer(ADMIN))).json()
        assert state == {"turn_id": turn_id, "status": "running", "result": None, "error": None}
        cancelled = await http.post(f"/api/turns/{turn_id}/cancel", headers=bearer(READER))
        assert (cancelled.status_code, cancelled.json()) == (202, {"turn_id": turn_id})
        got = await watcher
        assert got[-1][:2] == ("end", {"status": "cancelled", "error": "the turn was cancelled"})
        state = (await http.get(f"/api/turns/{turn_id}", headers=bearer(ADMIN))).json()
        assert state["status"] == "cancelled" and state["result"] is None
        again = await http.post(f"/api/turns/{turn_id}/cancel", headers=bearer(ADMIN))
        assert again.status_code == 409 and "has ended" in again.json()["error"]


async def test_a_session_opened_sent_to_streamed_resumed_and_closed(
    harness: HarnessFactory,
) -> None:
    async with harness({"local": [blocked]}, **PASSTHROUGH) as h, gateway(h) as http:
        opened = await http.post("/api/sessions", json={"agent": "test"}, headers=bearer(READER))
        assert opened.status_code == 201, opened.text
        session_id = opened.json()["session_id"]
        base = f"/api/sessions/{session_id}"
        seen: Events = []
        watcher = asyncio.ensure_future(events(http, f"{base}/events", READER, sink=seen))
        sent = await http.post(f"{base}/messages", json={"text": "first"}, headers=bearer(READER))
        assert sent.status_code == 202, sent.text
        # No `gateway.web_ui` here: no link.
        assert sent.json() == {"turn": 1, "turn_id": f"{session_id}/turn-1", "web_ui": None}
        await eventually(lambda: len(messages(seen)) >= 2, "the first exchange")
        first = messages(seen)[:2]
        assert [m["message"]["content"][0]["text"] for m in first] == ["first", "first"]
        assert {m["turn_id"] for m in first} == {f"{session_id}/turn-1"}
        await http.post(f"{base}/messages", json={"text": "second"}, headers=bearer(READER))
        await eventually(lambda: len(messages(seen)) >= 4, "the second exchange")
        state = (await http.get(base, headers=bearer(READER))).json()
        assert state["agent"] == "test" and state["open"] is True
        texts = [m["content"][0]["text"] for m in state["messages"]]
        assert texts == ["first", "first", "second", "second"]
        # A page that had messages 0 and 1 resumes after 1, as an EventSource reconnecting does.
        resumed: Events = []
        again = asyncio.ensure_future(
            events(http, f"{base}/events", READER, sink=resumed, **{"last-event-id": "1"})
        )
        await eventually(lambda: len(messages(resumed)) >= 2, "the resumed stream")
        assert [m["index"] for m in messages(resumed)] == [2, 3]
        closed = await http.post(f"{base}/close", headers=bearer(READER))
        assert closed.status_code == 202, closed.text
        for stream in (await watcher, await again):
            assert stream[-1][:2] == ("end", {"status": "completed", "error": None})
        assert [m["index"] for m in messages(await watcher)] == [0, 1, 2, 3]
        state = (await http.get(base, headers=bearer(READER))).json()
        assert state["open"] is False and len(state["messages"]) == 4
        late = await http.post(f"{base}/messages", json={"text": "x"}, headers=bearer(READER))
        assert late.status_code == 409 and "has ended" in late.json()["error"]


async def test_a_sessions_stream_stays_open_when_its_follower_fails_while_it_runs(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker restarting leaves the session's queries unanswered for a while: the feed's
    follower fails (here made to, after the first exchange, as an unanswered query does), and
    the feed follows the session again from its last message. The watcher's stream goes on,
    with no `end` until the session's close and every message once."""
    async with harness({"local": [blocked]}, **PASSTHROUGH) as h:
        app = gateway_app(
            h.client,
            h.settings.model_copy(
                update={"gateway": type(h.settings.gateway).model_validate({"keys": KEYS})}
            ),
            task_queue=h.task_queue,
        )
        hub = app.state.gateway.hub
        real = hub._follow_session
        starts: list[int] = []

        async def failing_once(feed: Any) -> None:
            starts.append(len(feed.messages))
            if len(starts) > 1:
                return await real(feed)
            following = asyncio.ensure_future(real(feed))
            await eventually(lambda: len(feed.messages) >= 2, "the first exchange followed")
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
            raise RPCError("no worker answered", RPCStatusCode.DEADLINE_EXCEEDED, b"")

        monkeypatch.setattr(hub, "_follow_session", failing_once)
        async with served(app) as http:
            opened = await http.post("/api/sessions", json={"agent": "test"}, headers=bearer(ADMIN))
            base = f"/api/sessions/{opened.json()['session_id']}"
            seen: Events = []
            watcher = asyncio.ensure_future(events(http, f"{base}/events", sink=seen))
            await http.post(f"{base}/messages", json={"text": "first"}, headers=bearer(ADMIN))
            await eventually(lambda: len(starts) == 2, "the feed follows the session again")
            await http.post(f"{base}/messages", json={"text": "second"}, headers=bearer(ADMIN))
            await eventually(lambda: len(messages(seen)) >= 4, "the second exchange")
            assert (await http.post(f"{base}/close", headers=bearer(ADMIN))).status_code == 202
            got = await watcher
    assert starts == [0, 2]
    assert [m["index"] for m in messages(got)] == [0, 1, 2, 3]
    texts = [m["message"]["content"][0]["text"] for m in messages(got)]
    assert texts == ["first", "first", "second", "second"]
    assert [data for name, data, _ in got if name == "end"] == [
        {"status": "completed", "error": None}
    ]


def gated(tmp_path: Path) -> dict[str, Any]:
    script = write_script(
        tmp_path / "script.json",
        {"tool_calls": {"w1": {"name": "fs__look", "arguments": {"name": "notes"}}}},
        "Done.",
    )
    agent = {
        "model": "playback",
        "playback": str(script),
        "servers": ["fs"],
        "approval": {"tools": ["fs__look"]},
    }
    return {"agents": {"test": agent, "other": {"model": "passthrough"}}}


async def test_approvals_listed_streamed_and_decided(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    async with harness({"fs": [look]}, **gated(tmp_path)) as h, gateway(h) as http:
        turn_id = await started_turn(http, "look at the notes")
        seen: Events = []
        watcher = asyncio.ensure_future(events(http, f"/api/turns/{turn_id}/events", sink=seen))
        waiting = await eventually(
            lambda: [d for n, d, _ in seen if n == "approval" and d["calls"]], "an approval event"
        )
        assert waiting[0]["turn_id"] == turn_id
        assert [(c["call_id"], c["name"]) for c in waiting[0]["calls"]] == [("w1", "fs__look")]
        listed = (await http.get(f"/api/turns/{turn_id}/approvals", headers=bearer(READER))).json()
        assert [(a["call_id"], a["turn_id"]) for a in listed["approvals"]] == [("w1", turn_id)]
        everywhere = (await http.get("/api/approvals", headers=bearer(READER))).json()
        assert ("w1", turn_id) in [(a["call_id"], a["turn_id"]) for a in everywhere["approvals"]]
        # A key of another agent sees none of it.
        assert (await http.get("/api/approvals", headers=bearer(OTHER))).json() == {"approvals": []}
        path = f"/api/turns/{turn_id}/approvals/w1"
        refused = await http.post(path, json={"approve": True}, headers=bearer(READER))
        assert refused.status_code == 403 and "may not decide" in refused.json()["error"]
        unknown = await http.post(
            f"/api/turns/{turn_id}/approvals/nope", json={"approve": True}, headers=bearer(ADMIN)
        )
        assert unknown.status_code == 409 and "not waiting" in unknown.json()["error"]
        # What another kind of wait takes does not fit an approval: refused, still waiting.
        for unfit, why in (
            ({"limit": 5}, "a limit goes only with a budget's wait"),
            ({"content": {}}, "content and cancel answer an elicitation"),
            ({"result": {"content": []}}, "not a client-side tool's"),
        ):
            refused = await http.post(path, json={"approve": True, **unfit}, headers=bearer(ADMIN))
            assert refused.status_code == 409 and why in refused.json()["error"], refused.text
        decided = await http.post(
            path,
            json={"approve": True, "reason": "fine", "remember": "turn"},
            headers=bearer(ADMIN),
        )
        assert decided.status_code == 200, decided.text
        record = decided.json()
        assert (record["decision"], record["by"], record["reason"], record["remember"]) == (
            "approve",
            "gateway key admin",
            "fine",
            "turn",
        )
        assert record["rule"]  # the "always allow" rule it set
        twice = await http.post(path, json={"approve": True}, headers=bearer(ADMIN))
        assert twice.status_code == 409, twice.text
        got = await watcher
        approvals = [d["calls"] for n, d, _ in got if n == "approval"]
        assert approvals[-1] == [] and got[-1][:2] == (
            "end",
            {"status": "completed", "error": None},
        )
        assert messages(got)[-1]["message"]["content"][0]["text"] == "Done."


async def test_bad_requests_get_one_line_errors_and_start_nothing(
    harness: HarnessFactory,
) -> None:
    async with (
        harness({"local": [blocked]}, **PASSTHROUGH) as h,
        gateway(h, max_body_bytes=2048) as http,
    ):
        other_turn = await started_turn(http, "hello", agent="other")
        # The server's visibility store lists a workflow shortly after its start.
        await eventually(lambda: has_workflows(h, 1), "the other agent's turn listed")

        async def error(method: str, path: str, key: str | None, **kwargs: Any) -> tuple[int, str]:
            headers = {**(bearer(key) if key else {}), **kwargs.pop("headers", {})}
            answer = await http.request(method, path, headers=headers, **kwargs)
            body = answer.json()
            assert list(body) == ["error"] and "\n" not in body["error"], body
            assert answer.status_code >= 400
            for secret in (ADMIN, READER, OTHER, WRONG):
                assert secret not in answer.text
            return answer.status_code, body["error"]

        start = {"agent": "test", "prompt": "hi"}
        assert (await error("POST", "/api/turns", None, json=start))[0] == 401
        assert (await error("POST", "/api/turns", WRONG, json=start))[0] == 401
        assert (await error("GET", "/api/agents", None, headers={"authorization": "Basic x"}))[
            0
        ] == 401
        assert await error("POST", "/api/turns", OTHER, json=start) == (
            403,
            "this key may not use agent 'test'",
        )
        assert await error("POST", "/api/turns", ADMIN, json={**start, "agent": "nobody"}) == (
            404,
            "no agent named 'nobody'",
        )
        status, message = await error("POST", "/api/turns", ADMIN, content=b'{"agent": "te')
        assert status == 400 and message.startswith("the request body is not valid JSON")
        assert await error("POST", "/api/turns", ADMIN, json=["x"]) == (
            422,
            "the request body must be a JSON object",
        )
        status, message = await error("POST", "/api/turns", ADMIN, json={"agent": "test"})
        assert (status, message) == (422, "prompt: Field required")
        status, message = await error("POST", "/api/turns", ADMIN, json={**start, "model": "x"})
        assert status == 422 and message.startswith("model: Extra inputs")
        big = {"agent": "test", "prompt": "x" * 5000}
        assert (await error("POST", "/api/turns", ADMIN, json=big))[0] == 413
        assert (await error("POST", "/api/sessions", ADMIN, content=b"x" * 5000))[0] == 413
        # Somebody else's turn: not for this key, whatever it asks.
        for method, path in (
            ("GET", f"/api/turns/{other_turn}"),
            ("GET", f"/api/turns/{other_turn}/events"),
            ("POST", f"/api/turns/{other_turn}/cancel"),
            ("GET", f"/api/turns/{other_turn}/approvals"),
        ):
            assert (await error(method, path, READER))[0] == 403, path
        status, message = await error(
            "POST", f"/api/turns/{other_turn}/approvals/c1", ADMIN, json={"approve": True}
        )
        assert status == 409 and "not waiting" in message
        assert await error("GET", "/api/turns/turn-test-nothere/events", ADMIN) == (
            404,
            "no turn 'turn-test-nothere'",
        )
        assert (await error("GET", "/api/sessions/session-nothere/events", ADMIN))[0] == 404
        # A turn is not a session, nor the other way round.
        assert (await error("GET", f"/api/sessions/{other_turn}", ADMIN))[0] == 404
        status, message = await error(
            "GET", f"/api/turns/{other_turn}/events", ADMIN, headers={"last-event-id": "x"}
        )
        assert (status, message) == (
            400,
            "Last-Event-ID must be one message index (an integer, -1 or more)",
        )
        assert (await error("GET", "/api/nothing", ADMIN))[0] == 404
        assert (await error("DELETE", "/api/turns", ADMIN))[0] == 405
        # Only the agents the key may use.
        agents = (await http.get("/api/agents", headers=bearer(READER))).json()
        assert agents == {"agents": [{"name": "test", "description": "echoes"}]}
        assert h.client  # the worker ran: the other agent's turn ended
        await eventually(
            lambda: turn_status(http, other_turn, "completed"), "the other agent's turn ended"
        )
        # Nothing but that turn was started on the worker's queue by all of the above.
        assert await has_workflows(h, 1)


async def turn_status(http: httpx2.AsyncClient, turn_id: str, status: str) -> bool:
    state = (await http.get(f"/api/turns/{turn_id}", headers=bearer(ADMIN))).json()
    return bool(state["status"] == status)


async def has_workflows(h: Harness, count: int) -> bool:
    query = f"TaskQueue = '{h.task_queue}'"
    return (await h.client.count_workflows(query)).count == count


async def test_rate_limits_and_cors(harness: HarnessFactory) -> None:
    page = "https://app.example.com"
    async with (
        harness({"local": [blocked]}, **PASSTHROUGH) as h,
        gateway(h, rate_limit={"per_second": 0.5, "burst": 3}, cors_origins=[page]) as http,
    ):
        codes = [
            (await http.get("/api/agents", headers=bearer(READER))).status_code for _ in range(5)
        ]
        assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
        limited = await http.get("/api/agents", headers=bearer(READER))
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        # Another key has its own bucket.
        assert (await http.get("/api/agents", headers=bearer(OTHER))).status_code == 200

        async def preflight(origin: str) -> httpx2.Response:
            return await http.options(
                "/api/turns",
                headers={
                    "origin": origin,
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "authorization, content-type",
                },
            )

        allowed = await preflight(page)
        assert allowed.headers["access-control-allow-origin"] == page
        refused = await preflight("https://evil.example.com")
        assert "access-control-allow-origin" not in refused.headers
        answer = await http.get("/api/agents", headers={**bearer(OTHER), "origin": page})
        assert answer.headers["access-control-allow-origin"] == page


async def test_the_openapi_document_served_is_the_one_in_the_docs(
    harness: HarnessFactory,
) -> None:
    async with harness({"local": [blocked]}, **PASSTHROUGH) as h, gateway(h) as http:
        served_doc = (await http.get("/openapi.json")).json()
    assert served_doc == openapi_document()
    assert json.loads(OPENAPI.read_text(encoding="utf-8")) == served_doc, (
        "docs/serving/openapi.json is stale: "
        "python -m turnkeep.doors.gateway.openapi > docs/serving/openapi.json"
    )


def conforms(document: dict[str, Any], path: str, got: Events) -> None:
    """Each event of a stream as the document's `itemSchema` for ``path`` describes it, its
    `data` too (a JSON text of its `contentSchema`, which a schema validator only notes)."""
    item = document["paths"][path]["get"]["responses"]["200"]["content"]["text/event-stream"]
    kinds = {s["properties"]["event"]["const"]: s for s in item["itemSchema"]["oneOf"]}
    last_id = None
    for name, data, event_id in got:
        last_id = event_id or last_id  # a client's parser carries the last id on
        parsed = {"event": name, "data": json.dumps(data)}
        if last_id is not None:
            parsed["id"] = last_id
        root = {"components": document["components"]}
        jsonschema.validate(parsed, {**item["itemSchema"], **root})
        content = kinds[name]["properties"]["data"]["contentSchema"]
        jsonschema.validate(data, {**content, **root})


async def test_what_the_document_says_of_methods_resuming_and_events_holds(
    harness: HarnessFactory,
) -> None:
    document = openapi_document()
    async with harness({"local": [blocked]}, **PASSTHROUGH) as h, gateway(h) as http:
        turn_id = await started_turn(http, "hello", agent="other")
        got = await events(http, f"/api/turns/{turn_id}/events")
        assert [name for name, _, _ in got][-1] == "end"
        conforms(document, "/api/turns/{turn_id}/events", got)
        # A route's path with a method it does not take: 405 and what it takes, not a turn
        # named `<id>/cancel`.
        for route in ("/api/turns/{turn_id}/cancel", "/api/turns/{turn_id}/approvals/{call_id}"):
            assert list(document["paths"][route]) == ["post"]
            path = route.format(turn_id=turn_id, call_id="c1")
            answer = await http.get(path, headers=bearer(ADMIN))
            assert (answer.status_code, answer.headers["allow"]) == (405, "POST"), answer.text
            assert answer.json() == {"error": f"method not allowed on this path: GET {path}"}
        answer = await http.put(f"/api/turns/{turn_id}", headers=bearer(ADMIN))
        assert answer.status_code == 405
        assert set(answer.headers["allow"].split(", ")) == {"GET", "HEAD"}
        # A resume point is what the document says: an integer from -1 on, nothing else.
        header = next(
            p
            for p in document["paths"]["/api/turns/{turn_id}/events"]["get"]["parameters"]
            if p["name"] == "Last-Event-ID"
        )
        assert header["schema"]["type"] == "integer" and header["schema"]["minimum"] == -1
        path = f"/api/turns/{turn_id}/events"
        for bad in ("x", "1.5", "+5", "5_0", "1e3", "", "-2", "0x1", str(2**63)):
            answer = await http.get(path, headers={**bearer(ADMIN), "last-event-id": bad})
            assert answer.status_code == 400, bad
            answer = await http.get(path, params={"after": bad}, headers=bearer(ADMIN))
            assert answer.status_code == 400, bad
        resumed = await events(http, path, **{"last-event-id": "0"})
        assert [m["index"] for m in messages(resumed)] == [1]
        assert len(messages(await events(http, path, **{"last-event-id": "-1"}))) == 2
        # A bad header is refused even where `?after=` decides.
        answer = await http.get(
            path, params={"after": "0"}, headers={**bearer(ADMIN), "last-event-id": "x"}
        )
        assert answer.status_code == 400
        # A query parameter no route reads is named, not ignored.
        answer = await http.get(path, params={"aftr": "0"}, headers=bearer(ADMIN))
        assert (answer.status_code, answer.json()) == (
            400,
            {"error": "unknown query parameter 'aftr'"},
        )
        answer = await http.get(f"/api/turns/{turn_id}?after=0", headers=bearer(ADMIN))
        assert answer.status_code == 400
        assert all(
            "400" in op["responses"] for ops in document["paths"].values() for op in ops.values()
        )
        # A content block without its `type`: the document requires it, the gateway refuses it.
        block = document["components"]["schemas"]["TextContent"]
        assert "type" in block["required"]
        answer = await http.post(
            f"/api/turns/{turn_id}/approvals/c1",
            json={"approve": True, "result": {"content": [{"text": "no type"}]}},
            headers=bearer(ADMIN),
        )
        assert answer.status_code == 422 and "discriminator 'type'" in answer.json()["error"]
        # A value of another type than the document's is refused, not coerced (`0` for false).
        for body in ({"approve": 0}, {"approve": True, "limit": "3"}):
            answer = await http.post(
                f"/api/turns/{turn_id}/approvals/c1", json=body, headers=bearer(ADMIN)
            )
            assert answer.status_code == 422, body


async def test_closes_and_cancels_racing_each_other_answer_202_or_409(
    harness: HarnessFactory,
) -> None:
    """A close (a cancel) that finds the session (the turn) running, and then ended by another
    before its own update reaches it, is told it has ended (409), not Temporal's not-found."""
    async with harness({"local": [blocked]}, **PASSTHROUGH) as h, gateway(h) as http:
        answers: list[httpx2.Response] = []
        for _ in range(5):
            opened = await http.post("/api/sessions", json={"agent": "test"}, headers=bearer(ADMIN))
            path = f"/api/sessions/{opened.json()['session_id']}/close"
            answers += await asyncio.gather(
                *(http.post(path, headers=bearer(ADMIN)) for _ in range(4))
            )
            turn_id = await started_turn(http, SLOW_CALL)
            path = f"/api/turns/{turn_id}/cancel"
            answers += await asyncio.gather(
                *(http.post(path, headers=bearer(ADMIN)) for _ in range(4))
            )
        assert {a.status_code for a in answers} <= {202, 409}, [a.text for a in answers]
        assert 202 in {a.status_code for a in answers}


async def test_a_watcher_too_far_behind_is_let_go_not_buffered() -> None:
    watcher = Watcher(0, buffer=16)
    for i in range(1000):
        watcher.offer(Event(kind="message", frame=b"x", index=i, count=i))
    # It holds one marker, not the thousand events: its stream ends, and the client resumes
    # from the last message it got.
    assert watcher.dropped and watcher.queue.qsize() == 1


async def test_a_sessions_waiting_call_is_streamed_and_decided_through_its_turn(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    async with harness({"fs": [look]}, **gated(tmp_path)) as h, gateway(h) as http:
        opened = await http.post("/api/sessions", json={"agent": "test"}, headers=bearer(ADMIN))
        base = f"/api/sessions/{opened.json()['session_id']}"
        seen: Events = []
        watcher = asyncio.ensure_future(events(http, f"{base}/events", sink=seen))
        sent = await http.post(f"{base}/messages", json={"text": "look"}, headers=bearer(ADMIN))
        turn_id = sent.json()["turn_id"]  # `<session>/turn-1`: a '/' in the path
        waiting = await eventually(
            lambda: [d for n, d, _ in seen if n == "approval" and d["calls"]], "an approval event"
        )
        assert waiting[0]["turn_id"] == turn_id
        listed = (await http.get(f"/api/turns/{turn_id}/approvals", headers=bearer(ADMIN))).json()
        assert [a["call_id"] for a in listed["approvals"]] == ["w1"]
        denied = await http.post(
            f"/api/turns/{turn_id}/approvals/w1",
            json={"approve": False, "reason": "not now"},
            headers=bearer(ADMIN),
        )
        assert denied.status_code == 200 and denied.json()["decision"] == "deny", denied.text
        await eventually(
            lambda: [
                d for n, d, _ in seen if n == "approval" and d == {"turn_id": turn_id, "calls": []}
            ],
            "the approval event saying none waits",
        )
        await eventually(lambda: len(messages(seen)) >= 4, "the turn's answer after the denial")
        assert (await http.post(f"{base}/close", headers=bearer(ADMIN))).status_code == 202
        got = await watcher
        assert got[-1][:2] == ("end", {"status": "completed", "error": None})
        assert {m["turn_id"] for m in messages(got)} == {turn_id}


async def test_the_command_refuses_no_auth_off_loopback_and_a_config_without_keys(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    config = tmp_path / "turnkeep.yaml"
    config.write_text("agents: {test: {model: passthrough}}\n", encoding="utf-8")
    wide = await asyncio.to_thread(
        turnkeep,
        "gateway",
        "--no-auth",
        "--listen",
        "0.0.0.0:8080",
        temporal=temporal,
        cwd=tmp_path,
    )
    assert wide.returncode != 0 and "loopback only" in wide.stderr, wide.stderr
    keyless = await asyncio.to_thread(
        turnkeep, "gateway", "--config", str(config), temporal=temporal, cwd=tmp_path
    )
    assert keyless.returncode != 0 and "no API keys" in keyless.stderr, keyless.stderr


def start_command(
    config: Path, port: int, env: dict[str, str], log: Path, *options: str
) -> subprocess.Popen[bytes]:
    """`turnkeep gateway` (with ``options``) for ``config`` on ``port``, its output to
    ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "turnkeep.cli", "--log-level", "debug", "gateway"),
                *("--config", str(config), "--listen", f"127.0.0.1:{port}", *options),
            ],
            cwd=config.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def test_the_command_serves_the_config_and_logs_no_key(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    config = tmp_path / "turnkeep.yaml"
    config.write_text(
        "agents: {test: {model: passthrough}}\n"
        "gateway: {keys: {ops: {key: '${OPS_KEY}', agents: ['*']}}}\n",
        encoding="utf-8",
    )
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.address, "OPS_KEY": ADMIN}
    log = tmp_path / "gateway.log"
    process = start_command(config, port, env, log)
    try:
        async with httpx2.AsyncClient(
            base_url=http_url("127.0.0.1", port), trust_env=False
        ) as http:

            async def up() -> bool:
                with contextlib.suppress(httpx2.TransportError):
                    return (await http.get("/openapi.json")).status_code == 200
                return False

            await eventually(up, "the gateway serves")
            agents = await http.get("/api/agents", headers=bearer(ADMIN))
            assert agents.json() == {"agents": [{"name": "test", "description": None}]}
            assert (await http.get("/api/agents", headers=bearer(WRONG))).status_code == 401
            bad = await http.post("/api/turns", content=ADMIN.encode(), headers=bearer(ADMIN))
            assert bad.status_code == 400 and ADMIN not in bad.text
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    output = log.read_text()
    assert f"127.0.0.1:{port}" in output
    for secret in (ADMIN, WRONG):
        assert secret not in output


async def test_a_failed_turn_says_why_in_its_own_words(harness: HarnessFactory) -> None:
    """A turn that failed says what failed (the activity's own error, without its wrapper),
    in its state and its stream's `end`, and names no secret of the server's command."""
    server = {"command": "no-such-mcp-server-xyz", "args": ["--token", "tok-secret-1c5e"]}
    config = {
        "mcp": {"servers": {"gone": server}},
        "agents": {"test": {"model": "passthrough", "servers": ["gone"]}},
    }
    async with harness(**config) as h, gateway(h) as http:
        started = await http.post(
            "/api/turns", json={"agent": "test", "prompt": "go"}, headers=bearer(ADMIN)
        )
        turn_id = started.json()["turn_id"]
        got = await events(http, f"/api/turns/{turn_id}/events")
        state = (await http.get(f"/api/turns/{turn_id}", headers=bearer(ADMIN))).json()
    why = (
        "ServerUnavailable: MCP server 'gone' (stdio) could not be started: "
        "its command could not be run: No such file or directory"
    )
    assert got[-1][:2] == ("end", {"status": "failed", "error": why})
    assert (state["status"], state["error"]) == ("failed", why)
