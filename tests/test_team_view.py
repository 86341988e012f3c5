"""Teams you can see into: `turnkeep show` lists a turn's child turns (a team's steps, the
agents it called as tools) from its history alone, and `run` (``stream_with_children``) prints
each child as it starts and ends, in order, and its live text. Real dev server, passthrough
models."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from temporalio.client import Client

from tests.conftest import Harness, HarnessFactory, make_settings, turnkeep
from turnkeep.cli.render import TurnRenderer
from turnkeep.client.children import ChildEnded, ChildStarted, ChildText, ChildTurn, TurnEvent
from turnkeep.client.live import MessageEvent
from turnkeep.client.status import TurnStatus
from turnkeep.contract.messages import Message
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.workflows.agent_tools import child_id

pytestmark = pytest.mark.asyncio

AGENTS: dict[str, Any] = {
    "writer": {"model": "passthrough"},
    "editor": {"model": "passthrough"},
    "post": {"type": "chain", "sequence": ["writer", "editor"]},
    "boss": {"model": "passthrough", "agents": ["writer"]},
    "both": {"type": "parallel", "fan_out": ["writer", "editor"], "fan_in": "writer"},
}


@pytest.fixture
async def h(client: Client, tmp_path: Path) -> AsyncIterator[Harness]:
    async with worker_harness(client, make_settings(tmp_path, agents=AGENTS)) as worker:
        yield worker


async def show(
    workflow_id: str, temporal: ServerInfo, tmp_path: Path
) -> tuple[str, dict[str, Any]]:
    """`show` as text and as JSON (no worker running); both must succeed."""
    text, as_json = await asyncio.gather(
        asyncio.to_thread(turnkeep, "show", workflow_id, temporal=temporal, cwd=tmp_path),
        asyncio.to_thread(turnkeep, "show", workflow_id, "--json", temporal=temporal, cwd=tmp_path),
    )
    assert text.returncode == 0, text.stdout + text.stderr
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    return text.stdout, json.loads(as_json.stdout)


async def test_show_lists_a_chains_steps_before_its_answer(
    h: Harness, temporal: ServerInfo, tmp_path: Path
) -> None:
    turn = await h.start("draft", agent="post")
    await turn.result()
    text, view = await show(turn.workflow_id, temporal, tmp_path)

    first, second = child_id(turn.workflow_id, 1, "writer"), child_id(turn.workflow_id, 2, "editor")
    children = view["children"]
    assert [c["workflow_id"] for c in children] == [first, second]
    assert [(c["agent"], c["step"], c["call_id"]) for c in children] == [
        ("writer", 1, None),
        ("editor", 2, None),
    ]
    assert all(c["status"] == "completed" and c["stop_reason"] == "endTurn" for c in children)
    assert all(c["usage"]["passthrough"]["calls"] == 1 for c in children)
    assert all(c["run_id"] and c["closed_at"] and c["took_ms"] is not None for c in children)

    lines = text.splitlines()
    steps = [i for i, line in enumerate(lines) if line.startswith("  ↳ ")]
    answer = next(i for i, line in enumerate(lines) if line.startswith("assistant ›"))
    assert len(steps) == 2 and steps[-1] < answer  # each step, then what the chain answered
    assert lines[steps[0]].startswith("  ↳ writer · step 1 · completed · ")
    assert f"turn {first} · usage: passthrough: " in lines[steps[0]]
    assert lines[steps[1]].startswith("  ↳ editor · step 2 · completed · ")
    assert f"turn {second}" in lines[steps[1]]


async def test_show_lists_an_agent_called_as_a_tool_under_its_call(
    h: Harness, temporal: ServerInfo, tmp_path: Path
) -> None:
    ask = f"***CALL_TOOL agent__writer {json.dumps({'message': 'a haiku'})}"
    turn = await h.start(ask, agent="boss")
    result = await turn.result()
    text, view = await show(turn.workflow_id, temporal, tmp_path)

    [call_id] = result.messages[1].tool_calls or {}
    [child] = view["children"]
    assert child["workflow_id"] == child_id(turn.workflow_id, 1, call_id)
    assert (child["agent"], child["call_id"], child["status"]) == ("writer", call_id, "completed")
    assert child["usage"]["passthrough"]["calls"] == 1

    lines = text.splitlines()
    call = next(i for i, line in enumerate(lines) if line.startswith("  → agent__writer("))
    assert lines[call + 1].startswith(f"  ↳ writer · call {call_id} · completed · ")
    assert f"turn {child['workflow_id']}" in lines[call + 1]


async def test_a_chains_stream_tells_each_step_as_it_starts_and_ends_in_order(h: Harness) -> None:
    turn = await h.start("draft", agent="post")
    events: list[TurnEvent] = [e async for e in turn.stream_with_children()]

    told = [
        (type(e).__name__, e.child.agent, e.child.status)
        for e in events
        if isinstance(e, ChildStarted | ChildEnded)
    ]
    assert told == [
        ("ChildStarted", "writer", TurnStatus.RUNNING),
        ("ChildEnded", "writer", TurnStatus.COMPLETED),
        ("ChildStarted", "editor", TurnStatus.RUNNING),
        ("ChildEnded", "editor", TurnStatus.COMPLETED),
    ]
    # The chain's answer comes after the steps that made it.
    assert isinstance(events[-1], MessageEvent) and events[-1].message.text == "draft"


async def test_a_parallels_stream_tells_its_branches_then_its_fan_in(h: Harness) -> None:
    turn = await h.start("draft", agent="both")
    events = [e async for e in turn.stream_with_children()]
    told = [
        (type(e).__name__, e.child.workflow_id.removeprefix(turn.workflow_id))
        for e in events
        if isinstance(e, ChildStarted | ChildEnded)
    ]
    # Both branches start before either ends (they run at once); the fan-in comes last.
    assert told[:2] == [("ChildStarted", "/1/0-writer"), ("ChildStarted", "/1/1-editor")]
    assert sorted(told[2:4]) == [("ChildEnded", "/1/0-writer"), ("ChildEnded", "/1/1-editor")]
    assert told[4:] == [("ChildStarted", "/2/writer"), ("ChildEnded", "/2/writer")]
    assert all(e.child.call_id is None for e in events if isinstance(e, ChildStarted))


async def test_an_agent_called_as_a_tool_is_told_after_the_call_and_before_its_result(
    h: Harness,
) -> None:
    ask = f"***CALL_TOOL agent__writer {json.dumps({'message': 'a haiku'})}"
    turn = await h.start(ask, agent="boss")
    events = [e async for e in turn.stream_with_children(include_tool_results=True)]
    kinds = [
        "call"
        if isinstance(e, MessageEvent) and e.message.tool_calls
        else "result"
        if isinstance(e, MessageEvent) and e.message.tool_results
        else type(e).__name__
        for e in events
    ]
    assert kinds[:4] == ["call", "ChildStarted", "ChildEnded", "result"]
    [call_id] = events[0].message.tool_calls or {}  # type: ignore[union-attr]
    started = events[1]
    assert isinstance(started, ChildStarted)
    assert (started.child.agent, started.child.call_id) == ("writer", call_id)


async def test_run_of_a_chain_prints_each_step_when_piped(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    settings = {"task_queue": f"team-view-{uuid.uuid4().hex[:8]}", "agents": AGENTS}
    (tmp_path / "turnkeep.yaml").write_text(json.dumps(settings), encoding="utf-8")
    done: subprocess.CompletedProcess[str] = await asyncio.to_thread(
        turnkeep, "run", "draft", "--agent", "post", "--worker", temporal=temporal, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    turn_id = lines[0].removeprefix("turn ")
    steps = [line for line in lines if line.startswith("  ↳ ")]
    assert [" · ".join(line.split(" · ")[:3]) for line in steps] == [
        "  ↳ writer · step 1 · started",
        "  ↳ writer · step 1 · completed",
        "  ↳ editor · step 2 · started",
        "  ↳ editor · step 2 · completed",
    ]
    assert f"turn {child_id(turn_id, 1, 'writer')}" in steps[0]
    assert lines.index(steps[-1]) < lines.index("assistant › draft")


async def test_a_steps_live_text_comes_between_its_start_and_end(
    fake: FakeModelApi, harness: HarnessFactory
) -> None:
    held = threading.Event()
    model = {"model": "openai.test-model"}
    try:
        # The first step's last chunk waits until its text has been seen: it is live.
        fake.script(
            Reply.text("Once upon a time.", hold=held), Reply.text("The end."), api="openai"
        )
        config = {
            "openai": {"api_key": "sk-team-view", "base_url": fake.base_url_openai},
            "streaming": {"listen": "127.0.0.1:0"},
            "agents": {**AGENTS, "writer": model, "editor": model},
        }
        async with harness(**config) as h:
            turn = await h.start("draft", agent="post")
            events: list[TurnEvent] = []
            async for event in turn.stream_with_children():
                events.append(event)
                if isinstance(event, ChildText):
                    held.set()
    finally:
        held.set()
    first = child_id(turn.workflow_id, 1, "writer")
    said = [e for e in events if isinstance(e, ChildText)]
    assert "".join(e.text for e in said if e.workflow_id == first) == "Once upon a time."
    assert {e.agent for e in said} <= {"writer", "editor"}
    started = next(i for i, e in enumerate(events) if isinstance(e, ChildStarted))
    ended = next(i for i, e in enumerate(events) if isinstance(e, ChildEnded))
    assert started < events.index(said[0]) < ended
    assert isinstance(events[-1], MessageEvent) and events[-1].message.text == "The end."


async def test_the_cli_prints_a_childs_live_text_on_a_line_of_its_own() -> None:
    console = Console(record=True, width=200, force_terminal=False)
    renderer = TurnRenderer(console)
    child = ChildTurn(
        workflow_id="t/1/writer",
        agent="writer",
        step=1,
        name="writer",
        status=TurnStatus.RUNNING,
        started_at="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
    )
    ended = child.model_copy(update={"status": TurnStatus.COMPLETED, "took_ms": 1500.0})
    for event in (
        ChildStarted(child=child),
        ChildText(workflow_id="t/1/writer", agent="writer", text="Once "),
        ChildText(workflow_id="t/1/writer", agent="writer", text="upon\x1b[2J"),
        ChildEnded(child=ended),
        MessageEvent(message=Message.assistant("The end.")),
    ):
        renderer.live(event)
    assert console.export_text().splitlines() == [
        "  ↳ writer · step 1 · started · turn t/1/writer",
        "    writer › Once upon\\x1b[2J",
        "  ↳ writer · step 1 · completed · 1.50 s · turn t/1/writer",
        "assistant › The end.",
    ]
    # As `show` lists one still running: for how long so far.
    renderer.child(child)
    assert console.export_text().splitlines()[-1].startswith("  ↳ writer · step 1 · running · for ")
