"""Agents served over A2A (``turnkeep.doors.a2a``), called with the ``a2a-sdk`` client over
HTTP on loopback, against the real dev server, a worker and the fake model API: a task is a
session, a message a turn, ``input-required`` an approval wait, streaming the live text."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import AgentCardResolutionError, ClientConfig, create_client
from a2a.client.client import Client as A2AClient
from a2a.helpers.proto_helpers import get_message_text, new_data_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.timestamp_pb2 import Timestamp

from tests.conftest import Harness, HarnessFactory, eventually
from turnkeep.client.sessions import get_session
from turnkeep.client.turns import get_turn
from turnkeep.doors.a2a import a2a_app, session_id_for, task_id_for
from turnkeep.doors.gateway import gateway_app
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.testing.fake_api import Answer, FakeModelApi, Reply
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio

KEY = "sk-turnkeep-a2a-7d1e"  # the provider key: never in an answer
written: list[str] = []
started: list[str] = []
gate = asyncio.Event()


def write(text: str) -> str:
    """Writes ``text``."""
    written.append(text)
    return f"wrote {text}"


async def wait_here(name: str) -> str:
    """Runs until the test opens the gate."""
    started.append(name)
    await gate.wait()
    return f"{name} done"


@pytest.fixture(autouse=True)
def _reset() -> None:
    written.clear()
    started.clear()
    gate.clear()


def config(fake: FakeModelApi) -> dict[str, Any]:
    return {
        "openai": {"api_key": KEY, "base_url": fake.base_url_openai},
        "streaming": {"listen": "127.0.0.1:0"},
        "agents": {
            "test": {
                "model": "openai.test-model",
                "servers": ["fs"],
                "description": "Writes things down.",
                "approval": {"tools": ["fs__write"]},
            },
            "other": {"model": "openai.test-model"},
        },
    }


@asynccontextmanager
async def served(h: Harness, agents: list[str] | None = None) -> AsyncIterator[str]:
    """The A2A routes of the harness's worker on loopback; yields the base URL."""
    app = a2a_app(h.client, h.settings, agents or ["test"], task_queue=h.task_queue)
    server = AsgiServer(app, name="a2a")
    port = await server.start(bind("127.0.0.1", 0))
    try:
        yield http_url("127.0.0.1", port)
    finally:
        await server.stop()


@asynccontextmanager
async def a2a_client(
    base: str, *, streaming: bool, key: str | None = None
) -> AsyncIterator[A2AClient]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        client = await create_client(
            f"{base}/a2a/test/", ClientConfig(streaming=streaming, httpx_client=http)
        )
        yield client


def user(
    text: str = "",
    *,
    task_id: str = "",
    context_id: str = "",
    parts: list[Part] | None = None,
    message_id: str = "",
) -> SendMessageRequest:
    message = Message(
        message_id=message_id or uuid.uuid4().hex,
        role=Role.ROLE_USER,
        parts=parts if parts is not None else [Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )
    return SendMessageRequest(message=message)


async def send(client: A2AClient, request: SendMessageRequest) -> list[StreamResponse]:
    return [event async for event in client.send_message(request)]


def final_task(events: list[StreamResponse]) -> Task:
    (only,) = events
    assert only.HasField("task")
    return only.task


async def test_a_context_is_a_session_and_each_message_a_task_that_ends_with_its_turn(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Reply.text("Noted: milk."),
        Reply.text("You asked about milk."),
        Reply.text("Still milk."),
        api="openai",
    )
    async with harness({"fs": [write]}, **config(fake)) as h, served(h) as base:
        async with httpx.AsyncClient() as http:
            card = (await http.get(f"{base}/a2a/test/.well-known/agent-card.json")).json()
        assert card["name"] == "test" and card["description"] == "Writes things down."
        assert card["capabilities"]["streaming"] is True
        assert card["supportedInterfaces"][0]["url"] == f"{base}/a2a/test/"
        assert [s["id"] for s in card["skills"]] == ["test"]
        assert "bearer" in card["securitySchemes"]
        async with a2a_client(base, streaming=False) as client:
            first = final_task(await send(client, user("remember milk", message_id="mine-1")))
            assert first.status.state == TaskState.TASK_STATE_COMPLETED
            assert get_message_text(first.status.message) == "Noted: milk."
            context = first.context_id
            assert first.id == task_id_for(context, 1) and first.id != context
            assert [a.name for a in first.artifacts] == ["answer"]
            # The client's message keeps its own id in the task's history.
            assert first.history[0].message_id == "mine-1"
            # The task has ended: it takes no more messages, and nothing is sent.
            with pytest.raises(UnsupportedOperationError, match="has ended"):
                await send(client, user("what did I ask?", task_id=first.id))
            assert len(fake.requests_for("openai")) == 1
            # The next message in the context is the next turn of its session: a new task.
            second = final_task(await send(client, user("what did I ask?", context_id=context)))
            assert (second.id, second.context_id) == (task_id_for(context, 2), context)
            assert get_message_text(second.status.message) == "You asked about milk."
            # One session: the model saw the first turn in the second request.
            said = json.dumps(fake.requests_for("openai")[-1].body["messages"])
            assert "remember milk" in said and "Noted: milk." in said
            # A task's history is its own exchange.
            assert [get_message_text(m) for m in second.history] == [
                "what did I ask?",
                "You asked about milk.",
            ]
            got = await client.get_task(GetTaskRequest(id=first.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert [get_message_text(m) for m in got.history] == ["remember milk", "Noted: milk."]
            session = get_session(h.client, session_id_for("test", context))
            assert (await session.progress()).turns_ended == 2
            # A task id and another context: refused, nothing sent.
            with pytest.raises(InvalidParamsError, match="is in context"):
                await send(client, user("hi", task_id=second.id, context_id="elsewhere"))
        # A client of A2A 0.3 (its method names, no A2A-Version header) reaches the same context.
        async with httpx.AsyncClient(timeout=60) as http:
            message = {
                "kind": "message",
                "messageId": "m3",
                "role": "user",
                "contextId": context,
                "parts": [{"kind": "text", "text": "and now?"}],
            }
            body = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "message/send",
                "params": {"message": message},
            }
            answer = (await http.post(f"{base}/a2a/test/", json=body)).json()
        assert answer["result"]["id"] == task_id_for(context, 3)
        assert answer["result"]["contextId"] == context
        assert answer["result"]["status"]["state"] == "completed"
        assert answer["result"]["status"]["message"]["parts"][0]["text"] == "Still milk."
    assert KEY not in json.dumps(card)


async def test_the_card_is_cached_by_etag_and_asks_for_a_key_only_when_the_gateway_does(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    async with harness({"fs": [write]}, **config(fake)) as h:
        for auth in (True, False):
            settings = h.settings.model_copy(
                update={"gateway": type(h.settings.gateway).model_validate({"keys": KEYS})}
            )
            app = gateway_app(
                h.client, settings, task_queue=h.task_queue, web=None, a2a=True, auth=auth
            )
            server = AsgiServer(app, name="gateway")
            base = http_url("127.0.0.1", await server.start(bind("127.0.0.1", 0)))
            try:
                async with httpx.AsyncClient(
                    timeout=30, headers={"authorization": f"Bearer {ADMIN}"}
                ) as http:
                    url = f"{base}/a2a/test/.well-known/agent-card.json"
                    card = await http.get(url)
                    assert card.status_code == 200
                    assert ("bearer" in card.json().get("securitySchemes", {})) is auth
                    assert bool(card.json().get("securityRequirements")) is auth
                    assert "max-age=" in card.headers["cache-control"]
                    etag, modified = card.headers["etag"], card.headers["last-modified"]
                    assert parsedate_to_datetime(modified) <= datetime.now(UTC)
                    again = await http.get(url, headers={"if-none-match": etag})
                    assert (again.status_code, again.content) == (304, b"")
                    assert again.headers["etag"] == etag
                    since = await http.get(url, headers={"if-modified-since": modified})
                    assert since.status_code == 304
                    stale = await http.get(url, headers={"if-none-match": '"other"'})
                    assert stale.status_code == 200 and stale.json() == card.json()
            finally:
                await app.state.gateway.hub.aclose()
                await server.stop()


async def test_streaming_carries_live_text_before_the_final_message(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    held = threading.Event()
    try:
        # The answer's last chunk waits until the client has seen live text.
        fake.script(Reply.text("Streaming works word by word.", hold=held), api="openai")
        async with (
            harness({"fs": [write]}, **config(fake)) as h,
            served(h) as base,
            a2a_client(base, streaming=True) as client,
        ):
            events: list[StreamResponse] = []
            async for event in client.send_message(user("stream please")):
                events.append(event)
                if event.HasField("artifact_update"):
                    held.set()
    finally:
        held.set()
    assert events[0].HasField("task")
    live = [
        e.artifact_update
        for e in events
        if e.HasField("artifact_update") and e.artifact_update.artifact.name == "live text"
    ]
    assert len(live) > 1 and not live[0].append and live[1].append
    assert "".join(u.artifact.parts[0].text for u in live) == "Streaming works word by word."
    final = events[-1]
    assert final.HasField("status_update")
    assert final.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_message_text(final.status_update.status.message) == "Streaming works word by word."
    first_live = events.index(next(e for e in events if e.HasField("artifact_update")))
    first_message = next(
        i
        for i, e in enumerate(events)
        if e.HasField("status_update") and e.status_update.status.HasField("message")
    )
    assert first_live < first_message


async def test_a_call_needing_approval_is_input_required_and_the_decision_resumes_it(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Answer(calls=(("w1", "fs__write", {"text": "draft"}),)),
        Reply.text("Wrote it."),
        Answer(calls=(("w2", "fs__write", {"text": "second"}),)),
        Reply.text("Not written."),
        api="openai",
    )
    async with harness({"fs": [write]}, **config(fake)) as h:
        async with served(h) as base, a2a_client(base, streaming=True) as client:
            events = await send(client, user("write a draft"))
            waiting = events[-1].status_update.status
            assert waiting.state == TaskState.TASK_STATE_INPUT_REQUIRED
            text = get_message_text(waiting.message)
            assert "fs__write" in text and "w1" in text and '"draft"' in text
            task_id, context = events[0].task.id, events[0].task.context_id
            assert written == []
            # A message that is not a decision is refused while the call waits.
            with pytest.raises(InvalidParamsError, match="wait for a decision"):
                await send(client, user("hello?", task_id=task_id))
            # So is a new task in the context: it would wait behind this one.
            with pytest.raises(InvalidParamsError, match="waits for input"):
                await send(client, user("hello?", context_id=context))
        # Another server, as after a gateway restart: nothing was kept but the session.
        async with served(h) as base, a2a_client(base, streaming=True) as client:
            got = await client.get_task(GetTaskRequest(id=task_id))
            assert got.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            decision = new_data_part(
                {"call_id": "w1", "approve": True, "arguments": {"text": "edited"}}
            )
            events = await send(client, user(task_id=task_id, parts=[decision]))
            end = events[-1].status_update.status
            assert end.state == TaskState.TASK_STATE_COMPLETED
            assert get_message_text(end.message) == "Wrote it."
            assert written == ["edited"]
        async with served(h) as base, a2a_client(base, streaming=False) as client:
            # Non-streaming, the next task of the context, decided by text.
            task = final_task(await send(client, user("another", context_id=context)))
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert task.id == task_id_for(context, 2)
            task = final_task(await send(client, user("deny: not today", task_id=task.id)))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert get_message_text(task.status.message) == "Not written."
            assert written == ["edited"]
            sent = fake.requests_for("openai")[-1].body["messages"]
            denied = [m for m in sent if m["role"] == "tool"][-1]
            assert denied["tool_call_id"] == "w2"
            assert "not today" in denied["content"]


async def test_cancel_cancels_the_turn_and_the_task_goes_on(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Answer(calls=(("s1", "fs__wait_here", {"name": "slow"}),)),
        Reply.text("Back again."),
        api="openai",
    )
    async with (
        harness({"fs": [write, wait_here]}, **config(fake)) as h,
        served(h) as base,
        a2a_client(base, streaming=True) as client,
    ):
        stream = client.send_message(user("do the slow thing"))
        first = await anext(stream)
        task_id, context = first.task.id, first.task.context_id
        session = get_session(h.client, session_id_for("test", context))
        await eventually(lambda: started, "the slow tool runs")
        # A second follower joins the running turn (tasks/resubscribe).
        joined = client.subscribe(SubscribeToTaskRequest(id=task_id))
        snapshot = await anext(joined)
        assert snapshot.task.status.state == TaskState.TASK_STATE_WORKING
        cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        for follower in (stream, joined):
            rest = [event async for event in follower]
            assert rest[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
        # A cancelled task has ended; the context goes on: the next message is a new turn
        # on the repaired conversation.
        with pytest.raises(UnsupportedOperationError, match="canceled"):
            await send(client, user("still there?", task_id=task_id))
        events = await send(client, user("still there?", context_id=context))
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        assert (await session.progress()).turns_ended == 2
        # The interrupted call was answered by the repair before the model was asked again.
        tool = [m for m in fake.requests_for("openai")[-1].body["messages"] if m["role"] == "tool"]
        assert tool[-1]["tool_call_id"] == "s1" and INTERRUPTED_TEXT in json.dumps(tool[-1])


async def test_unknown_agents_tasks_and_malformed_requests_are_refused_with_nothing_started(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    async with harness({"fs": [write]}, **config(fake)) as h, served(h) as base:
        async with httpx.AsyncClient(timeout=30) as http:
            # An agent of the settings that is not served, and one that does not exist.
            for agent in ("other", "ghost"):
                card = await http.get(f"{base}/a2a/{agent}/.well-known/agent-card.json")
                assert card.status_code == 404
                assert card.json() == {"error": f"no agent '{agent}' is served here"}
                answer = await http.post(
                    f"{base}/a2a/{agent}/",
                    json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}},
                )
                assert answer.json()["error"]["message"] == f"no agent '{agent}' is served here"
            with pytest.raises(AgentCardResolutionError):
                await create_client(f"{base}/a2a/ghost/", ClientConfig(httpx_client=http))
            rpc = f"{base}/a2a/test/"
            headers = {"A2A-Version": "1.0"}
            bad = await http.post(rpc, content=b"{not json", headers=headers)
            assert bad.json()["error"]["code"] == -32700

            async def error_of(message: dict[str, Any]) -> tuple[int, str]:
                body = {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "method": "SendMessage",
                    "params": {"message": message},
                }
                answer = (await http.post(rpc, json=body, headers=headers)).json()
                assert "result" not in answer
                return int(answer["error"]["code"]), str(answer["error"]["message"])

            async def message_of(message: dict[str, Any]) -> str:
                return (await error_of(message))[1]

            base_message = {"messageId": "m1", "role": "ROLE_USER"}
            assert "no parts" in await message_of({**base_message, "parts": []})
            assert "ROLE_USER" in await message_of(
                {**base_message, "role": "ROLE_AGENT", "parts": [{"text": "hi"}]}
            )
            # A file is content the agent does not take: A2A's ContentTypeNotSupportedError.
            for file in ({"url": "http://example.com/x"}, {"raw": "dGNr", "mediaType": "x/y"}):
                code, text = await error_of({**base_message, "parts": [file]})
                assert code == -32005 and "only text and data parts" in text
            assert "no task '../../etc'" in await message_of(
                {**base_message, "taskId": "../../etc", "parts": [{"text": "hi"}]}
            )
            assert "invalid context id" in await message_of(
                {**base_message, "contextId": "../../etc", "parts": [{"text": "hi"}]}
            )
            # A body that is not sent as JSON is refused as such, before it is read.
            plain = await http.post(
                rpc, content=b"{}", headers={**headers, "content-type": "text/plain"}
            )
            assert plain.json()["error"]["code"] == -32005
            assert "name it (taskId)" in await message_of(
                {**base_message, "parts": [{"data": {"call_id": "x", "approve": True}}]}
            )
            assert "decisions.0.approve" in await message_of(
                {**base_message, "parts": [{"data": {"call_id": "x"}}]}
            )
            too_long = "x" * 100_001
            assert "at most 100000" in await message_of(
                {**base_message, "parts": [{"text": too_long}]}
            )
            huge = await http.post(rpc, content=b" " * 1_048_577, headers=headers)
            assert "over 1048576 bytes" in huge.json()["error"]["message"]
        async with a2a_client(base, streaming=False) as client:
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id="no-such-task"))
            with pytest.raises(TaskNotFoundError):
                await send(client, user("hi", task_id="no-such-task"))
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id=task_id_for("no-such-context", 1)))
            with pytest.raises(ContentTypeNotSupportedError):
                await send(client, user(parts=[Part(url="http://example.com/x")]))
        # Nothing reached the model, and no session was started.
        assert fake.requests == []
        sessions = [
            w
            async for w in h.client.list_workflows(
                f"TaskQueue = '{h.task_queue}' AND WorkflowType = 'SessionWorkflow'"
            )
        ]
        assert sessions == []


ADMIN, READER, OTHER = "a2a-admin-key-0f3e", "a2a-reader-key-77c1", "a2a-other-key-5b20"
KEYS = {
    "admin": {"key": ADMIN, "agents": ["*"], "decide": True},
    "reader": {"key": READER, "agents": ["test"]},
    "other": {"key": OTHER, "agents": ["other"]},
}


async def test_behind_the_gateway_keys_say_who_may_call_and_who_may_decide(
    fake: FakeModelApi, harness: HarnessFactory, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script(Answer(calls=(("w1", "fs__write", {"text": "draft"}),)), Reply.text("Ok."))
    async with harness({"fs": [write]}, **config(fake)) as h:
        settings = h.settings.model_copy(
            update={"gateway": type(h.settings.gateway).model_validate({"keys": KEYS})}
        )
        app = gateway_app(h.client, settings, task_queue=h.task_queue, web=None, a2a=True)
        server = AsgiServer(app, name="gateway")
        base = http_url("127.0.0.1", await server.start(bind("127.0.0.1", 0)))
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                card_url = f"{base}/a2a/test/.well-known/agent-card.json"
                assert (await http.get(card_url)).status_code == 401
                wrong = await http.get(card_url, headers={"authorization": "Bearer nope"})
                assert wrong.status_code == 401
                body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}
                scoped = await http.post(
                    f"{base}/a2a/test/", json=body, headers={"authorization": f"Bearer {OTHER}"}
                )
                assert scoped.status_code == 403
                assert scoped.json()["error"]["message"] == "this key may not use agent 'test'"
            async with a2a_client(base, streaming=False, key=READER) as reader:
                task = final_task(await send(reader, user("write a draft")))
                assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
                with pytest.raises(InvalidRequestError, match="may not decide"):
                    await send(reader, user("approve", task_id=task.id))
            async with a2a_client(base, streaming=False, key=ADMIN) as admin:
                done = final_task(await send(admin, user("approve", task_id=task.id)))
                assert done.status.state == TaskState.TASK_STATE_COMPLETED
        finally:
            await app.state.gateway.hub.aclose()
            await server.stop()
        session = session_id_for("test", task.context_id)
        turn = await get_turn(h.client, f"{session}/turn-1").result()
        assert [(d.call_id, d.by) for d in turn.decisions] == [("w1", "gateway key admin via a2a")]
    assert written == ["draft"]
    # No key, the caller's or the provider's, in any log line.
    assert not any(k in caplog.text for k in (ADMIN, READER, OTHER, KEY))


async def test_list_tasks_reads_visibility_by_context_and_state_a_page_at_a_time(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Reply.text("One."),
        Reply.text("Two."),
        Reply.text("Three."),
        Answer(calls=(("w1", "fs__write", {"text": "draft"}),)),
        api="openai",
    )
    async with (
        harness({"fs": [write]}, **config(fake)) as h,
        served(h) as base,
        a2a_client(base, streaming=False) as client,
    ):
        first = final_task(await send(client, user("one")))
        here = first.context_id
        for text in ("two", "three"):
            await send(client, user(text, context_id=here))
        waiting = final_task(await send(client, user("write a draft")))
        assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED

        async def listed(**fields: Any) -> ListTasksResponse:
            return await client.list_tasks(ListTasksRequest(**fields))

        # Visibility is eventually consistent: wait until it has every task.
        await eventually(
            lambda: _total(listed(context_id=here, status=TaskState.TASK_STATE_COMPLETED), 3),
            "visibility has the context's three tasks",
        )
        page = await listed(context_id=here, page_size=2)
        assert (page.total_size, page.page_size, len(page.tasks)) == (3, 2, 2)
        assert page.next_page_token
        rest = await listed(context_id=here, page_size=2, page_token=page.next_page_token)
        assert len(rest.tasks) == 1 and rest.next_page_token == ""
        tasks = [*page.tasks, *rest.tasks]
        # Most recent first, every task of the context once, as GetTask reads it.
        assert [t.id for t in tasks] == [task_id_for(here, n) for n in (3, 2, 1)]
        assert {t.context_id for t in tasks} == {here}
        assert [get_message_text(t.status.message) for t in tasks] == ["Three.", "Two.", "One."]
        # Artifacts only when asked for; history as long as asked for.
        assert all(not t.artifacts for t in tasks)
        full = await listed(context_id=here, include_artifacts=True, history_length=1)
        assert all([a.name for a in t.artifacts] == ["answer"] for t in full.tasks)
        assert all(len(t.history) == 1 for t in full.tasks)
        # By state: the other context's task waits for input.
        asking = await eventually(
            lambda: _total(
                listed(context_id=waiting.context_id, status=TaskState.TASK_STATE_INPUT_REQUIRED),
                1,
            ),
            "visibility has the waiting task",
        )
        assert [t.id for t in asking.tasks] == [waiting.id]
        none = await listed(context_id=here, status=TaskState.TASK_STATE_INPUT_REQUIRED)
        assert (none.total_size, list(none.tasks)) == (0, [])
        # By when their status changed: none after tomorrow, all three since yesterday.
        for days, total in ((1, 0), (-1, 3)):
            when = Timestamp()
            when.FromDatetime(datetime.now(UTC).replace(tzinfo=None) + timedelta(days=days))
            recent = await listed(context_id=here, status_timestamp_after=when)
            assert (recent.total_size, len(recent.tasks)) == (total, total)
        with pytest.raises(InvalidParamsError, match="pageSize"):
            await listed(page_size=101)
        with pytest.raises(InvalidParamsError, match="pageToken"):
            await listed(page_token="not a token!")
        with pytest.raises(InvalidParamsError, match="context id"):
            await listed(context_id="../x")


async def _total(response: Awaitable[ListTasksResponse], total: int) -> ListTasksResponse | None:
    answer = await response
    return answer if answer.total_size == total else None


TCK_FIXTURE = Path(__file__).parent / "a2a_tck"


def asking_config(fake: FakeModelApi, **agent: Any) -> dict[str, Any]:
    """The agent ``test`` with the TCK fixture's ``ask`` tool: an MCP server whose tool asks
    the user a question (an elicitation of one string)."""
    server = {
        "command": sys.executable,
        "args": [str(TCK_FIXTURE / "tools.py")],
        "elicitation": {"mode": "forms"},
    }
    return {
        "openai": {"api_key": KEY, "base_url": fake.base_url_openai},
        "mcp": {"servers": {"tck": server}},
        "agents": {"test": {"model": "openai.test-model", "servers": ["tck"], **agent}},
    }


async def test_a_tools_question_is_input_required_and_a_text_answers_it(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Answer(calls=(("q1", "tck__ask", {"question": "Which colour?"}),)),
        Reply.text("Blue it is."),
        api="openai",
    )
    async with (
        harness(**asking_config(fake)) as h,
        served(h) as base,
        a2a_client(base, streaming=True) as client,
    ):
        events = await send(client, user("paint it"))
        asked = events[-1].status_update.status
        assert asked.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert "Which colour?" in get_message_text(asked.message)
        task_id = events[0].task.id
        # Two subscribers see the same events, and follow the task to its end.
        followers = [client.subscribe(SubscribeToTaskRequest(id=task_id)) for _ in range(2)]
        snapshots = [await anext(f) for f in followers]
        assert snapshots[0] == snapshots[1]
        assert snapshots[0].task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        answered = await send(client, user("blue", task_id=task_id))
        assert answered[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        for follower in followers:
            rest = [event async for event in follower]
            assert rest[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
            assert get_message_text(rest[-1].status_update.status.message) == "Blue it is."
        # The tool got the text as its answer.
        sent = fake.requests_for("openai")[-1].body["messages"]
        assert [m["content"] for m in sent if m["role"] == "tool"] == ["blue"]
        turn = await get_turn(
            h.client, f"{session_id_for('test', events[0].task.context_id)}/turn-1"
        ).result()
        assert [(d.kind, d.by) for d in turn.decisions] == [("elicitation", "anyone via a2a")]
        with pytest.raises(UnsupportedOperationError, match="has ended"):
            await anext(client.subscribe(SubscribeToTaskRequest(id=task_id)))


async def test_the_tck_fixture_agent_answers_as_the_tcks_scenarios_say(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    """The fixture agent ``tests/a2a_tck`` (its hook and its tool, the model its ``sut.py``
    serves) behaves as the TCK's scripted system under test, by message id."""
    sys.path.insert(0, str(TCK_FIXTURE))
    try:
        import sut  # type: ignore[import-not-found]
        import tck_hooks  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(TCK_FIXTURE))
    api = FakeModelApi(respond=sut.respond).start()
    try:
        agent = {"hooks": {"before_llm_call": ["tck"]}}
        options = asking_config(fake, **agent)
        options["openai"] = {"api_key": KEY, "base_url": api.base_url_openai}
        async with (
            harness(None, {"tck": tck_hooks.scripted}, **options) as h,
            served(h) as base,
            a2a_client(base, streaming=False) as client,
        ):
            done = final_task(await send(client, user("x", message_id="tck-complete-task-1")))
            assert get_message_text(done.status.message) == "Hello from TCK"
            text = final_task(await send(client, user("x", message_id="tck-artifact-text-1")))
            assert text.artifacts[0].parts[0].text == "Generated text content"
            # Only a task that waits for input asks the model, which asks the user.
            assert api.requests == []
            waits = final_task(await send(client, user("x", message_id="tck-input-required-1")))
            assert waits.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            again = final_task(await send(client, user("TCK history message 1", task_id=waits.id)))
            assert again.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            end = final_task(await send(client, user("Complete", task_id=waits.id)))
            assert end.status.state == TaskState.TASK_STATE_COMPLETED
            assert get_message_text(end.status.message) == "Hello from TCK"
    finally:
        api.stop()


async def test_a_message_sent_while_a_turn_runs_is_a_task_of_its_own_submitted_until_it_runs(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    fake.script(
        Answer(calls=(("s1", "fs__wait_here", {"name": "slow"}),)),
        Reply.text("Slow done."),
        Reply.text("Quick answer."),
        api="openai",
    )
    async with (
        harness({"fs": [write, wait_here]}, **config(fake)) as h,
        served(h) as base,
        a2a_client(base, streaming=True) as streaming,
        a2a_client(base, streaming=False) as client,
    ):
        stream = streaming.send_message(user("do the slow thing"))
        first = (await anext(stream)).task
        await eventually(lambda: started, "the slow tool runs")
        request = user("and a quick one", context_id=first.context_id)
        request.configuration.return_immediately = True
        queued = final_task(await send(client, request))
        assert queued.id == task_id_for(first.context_id, 2)
        assert queued.status.state == TaskState.TASK_STATE_SUBMITTED
        follower = streaming.subscribe(SubscribeToTaskRequest(id=queued.id))
        assert (await anext(follower)).task.status.state == TaskState.TASK_STATE_SUBMITTED
        gate.set()
        ends = [event async for event in stream]
        assert get_message_text(ends[-1].status_update.status.message) == "Slow done."
        # The queued task's events are its own turn's only.
        events = [event async for event in follower]
        said = [
            get_message_text(e.status_update.status.message)
            for e in events
            if e.HasField("status_update") and e.status_update.status.HasField("message")
        ]
        assert said == ["Quick answer.", "Quick answer."]  # its message, then its end
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        got = await client.get_task(GetTaskRequest(id=queued.id))
        assert [get_message_text(m) for m in got.history] == ["and a quick one", "Quick answer."]
