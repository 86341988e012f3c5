"""`turnkeep show`: a turn read from its workflow history alone (replayed through the workflow
code, timed by its events), with no worker running: completed, running, cancelled, failed and
continued-as-new turns, an unknown id, and a history the code no longer replays. Also
``TurnHandle.result()`` of a cancelled turn, which reads the repaired conversation the same
way."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHistory

from tests.conftest import HarnessFactory, eventually, turnkeep, write_script
from turnkeep.client.history import view_histories
from turnkeep.client.status import TurnStatus
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import RollbackState, TurnCancelledError, TurnInput, TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing.fake_api import FakeModelApi, Reply, Tokens
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio

HISTORIES = Path(__file__).with_name("histories")  # recorded by ``tests.test_replay``

gate = asyncio.Event()


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def wait_for_gate(name: str) -> str:
    """Blocks until the test opens the gate."""
    await gate.wait()
    return f"{name} passed"


TOOLS = {"local": [add, wait_for_gate]}


def playback(tmp_path: Path, *entries: Any) -> dict[str, Any]:
    script = write_script(tmp_path / "script.json", *entries)
    return {
        "agents": {"test": {"model": "playback", "playback": str(script), "servers": ["local"]}}
    }


def calls(*specs: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "tool_calls": {cid: {"name": f"local__{tool}", "arguments": a} for cid, tool, a in specs}
    }


async def show(
    workflow_id: str,
    temporal: ServerInfo,
    tmp_path: Path,
    *,
    json_out: bool = False,
    run_id: str | None = None,
    full: bool = False,
) -> subprocess.CompletedProcess[str]:
    args = ["show", workflow_id, *(["--json"] if json_out else []), *(["--full"] if full else [])]
    args += ["--run-id", run_id] if run_id else []
    return await asyncio.to_thread(turnkeep, *args, temporal=temporal, cwd=tmp_path)


async def show_both(
    workflow_id: str, temporal: ServerInfo, tmp_path: Path
) -> tuple[str, dict[str, Any]]:
    """`show` as text and as JSON; both must succeed."""
    text, as_json = await asyncio.gather(
        show(workflow_id, temporal, tmp_path), show(workflow_id, temporal, tmp_path, json_out=True)
    )
    assert text.returncode == 0, text.stdout + text.stderr
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    return text.stdout, json.loads(as_json.stdout)


def shows(view: dict[str, Any], result: TurnResult) -> bool:
    """Whether `show --json` gave ``result``: all of it but what repeats its messages."""
    return view["result"] == result.model_dump(mode="json", exclude={"history", "final"})


def activity(view: dict[str, Any], **match: Any) -> dict[str, Any]:
    (found,) = [a for a in view["activities"] if all(a[k] == v for k, v in match.items())]
    return found


async def test_show_a_completed_turn_with_tool_calls(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    config = playback(
        tmp_path,
        calls(("c1", "add", {"a": 1, "b": 2}), ("c2", "add", {"a": 30, "b": 12})),
        "The sums are 3 and 42.",
    )
    async with harness(TOOLS, **config) as h:
        turn = await h.start("Add 1+2 and 30+12.")
        result = await turn.result()
    # The worker has stopped: everything below comes from the history alone.
    text, view = await show_both(turn.workflow_id, temporal, tmp_path)

    assert view["status"] == "completed" and view["stop_reason"] == "endTurn"
    assert view["agent"] == "test" and view["model"] == "playback"
    assert view["closed_at"] is not None and len(view["runs"]) == 1
    # Exactly what the workflow itself returned: replay runs the same code.
    assert shows(view, result)
    messages = view["result"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1]["tool_calls"]["c2"]["arguments"] == {"a": 30, "b": 12}
    results = messages[2]["tool_results"]
    assert results["c1"]["content"][0]["text"] == "3"
    assert results["c2"]["content"][0]["text"] == "42"
    assert view["result"]["usage"]["playback"]["calls"] == 2
    assert view["result"]["usage"]["playback"]["input_tokens"] > 0
    # Timings per model call (by index) and per tool call (by id), from the event times.
    for timing in (
        activity(view, activity="llm_step", call_index=1),
        activity(view, activity="llm_step", call_index=2),
        activity(view, call_id="c1", tool="local__add"),
        activity(view, call_id="c2", tool="local__add"),
    ):
        assert timing["outcome"] == "completed" and timing["attempts"] == 1
        assert timing["total_ms"] >= timing["last_attempt_ms"] >= 0

    assert "user › Add 1+2 and 30+12." in text
    assert '→ local__add({"a": 30, "b": 12}) c2' in text
    assert "← local__add" in text and ": 42" in text
    assert "assistant › The sums are 3 and 42." in text
    assert "model calls: 2 in" in text and "#1 " in text and "#2 " in text
    assert "completed · started" in text
    assert "stop reason: endTurn · iterations: 1 · usage: playback:" in text


async def test_show_a_running_turn_stuck_in_a_model_call_with_no_worker(
    fake: FakeModelApi, harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    fake.script(
        Reply.tool_calls(("c1", "local__add", {"a": 2, "b": 3}), usage=Tokens(input=50, output=9)),
        Reply.delay(120, then=Reply.text("too late")),
        api="anthropic",
    )
    config = {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "agents": {"test": {"model": "anthropic.test-model", "servers": ["local"]}},
    }
    async with harness(TOOLS, **config) as h:
        turn = await h.start("Add 2 and 3, slowly.")
        await eventually(lambda: len(fake.requests_for("anthropic")) == 2, "the 2nd model call")
    # The worker has stopped (nothing polls this test's task queue): the model call stays in
    # flight, waiting for a worker to retry it.
    assert (await turn.handle.describe()).status == WorkflowExecutionStatus.RUNNING
    try:
        text, view = await show_both(turn.workflow_id, temporal, tmp_path)
    finally:
        await turn.handle.terminate("test over")

    assert view["status"] == "running" and view["closed_at"] is None
    # Not done: no stop reason, and replay ending mid-call must not look like a cancellation.
    assert view["stop_reason"] is None and view["result"]["rollback"] is None
    messages = view["result"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[2]["tool_results"]["c1"]["content"][0]["text"] == "5"
    assert view["result"]["usage"]["anthropic.test-model"]["input_tokens"] == 50
    assert activity(view, call_index=1)["outcome"] == "completed"
    in_flight = activity(view, call_index=2)
    assert in_flight["outcome"] in ("scheduled", "running") and in_flight["closed_at"] is None
    assert in_flight["total_ms"] is None

    assert "running · started" in text and "running for" in text
    assert "in flight: llm #2" in text
    assert "still running · iterations: 1" in text
    assert "stop reason" not in text


async def test_show_and_result_of_a_cancelled_turn_give_the_repair_with_no_worker(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    gate.clear()
    config = playback(
        tmp_path,
        calls(("c1", "add", {"a": 1, "b": 1}), ("c2", "wait_for_gate", {"name": "g"})),
        "never reached",
    )
    async with harness(TOOLS, **config) as h:
        turn = await h.start("go")

        async def quick_call_done() -> bool:  # prepare_turn, list_tools, llm_step, add
            return await completed_activities(turn) >= 4

        await eventually(quick_call_done, "the quick tool call finished")
        await turn.cancel()

        async def cancelled() -> bool:
            status = (await turn.handle.describe()).status
            return status == WorkflowExecutionStatus.CANCELED

        await eventually(cancelled, "the turn ended Canceled")
    gate.set()

    # No worker anywhere for this turn: the repaired conversation comes from its history.
    with pytest.raises(TurnCancelledError) as raised:
        await turn.result()
    repaired = raised.value.result
    assert repaired is not None
    assert repaired.stop_reason == StopReason.CANCELLED
    assert repaired.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    last = repaired.messages[-1].tool_results
    assert last is not None and last["c1"].text == "2" and not last["c1"].is_error
    assert last["c2"].text == INTERRUPTED_TEXT and last["c2"].is_error
    assert await turn.current() == repaired

    text, view = await show_both(turn.workflow_id, temporal, tmp_path)
    assert view["status"] == "cancelled" and view["stop_reason"] == "cancelled"
    assert shows(view, repaired)
    assert activity(view, call_id="c1")["outcome"] == "completed"
    assert activity(view, call_id="c2")["outcome"] == "cancelled"
    assert "cancelled · started" in text
    assert "← local__wait_for_gate cancelled after" in text and INTERRUPTED_TEXT in text
    assert "stop reason: cancelled" in text
    assert "history repair: appended_interrupted_tool_result" in text


async def completed_activities(turn: TurnHandle) -> int:
    events = [e async for e in turn.handle.fetch_history_events()]
    return sum(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED for e in events)


async def test_show_an_unknown_workflow_id_is_a_clear_error(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    for json_out in (False, True):
        shown = await show("no-such-turn", temporal, tmp_path, json_out=json_out)
        assert shown.returncode == 2 and shown.stdout == ""
        assert shown.stderr.startswith("error: no turn with workflow id 'no-such-turn'")
        assert len(shown.stderr.splitlines()) == 1, shown.stderr


async def test_show_a_turn_that_failed_to_prepare(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    async with harness(TOOLS, **playback(tmp_path, "unused")) as h:
        turn = await h.start("hello?", agent="nope")
        with pytest.raises(WorkflowFailureError):
            await turn.result()
    text, view = await show_both(turn.workflow_id, temporal, tmp_path)

    assert view["status"] == "failed" and view["result"] is None
    assert view["agent"] == "nope"
    assert view["failure"].startswith("UnknownAgent: Unknown agent 'nope'")
    assert [m["content"][0]["text"] for m in view["prompt"]] == ["hello?"]
    assert activity(view, activity="prepare_turn")["outcome"] == "failed"
    assert "user › hello?" in text
    assert "failed: UnknownAgent: Unknown agent 'nope'. This worker's agents: test." in text


async def test_a_history_the_code_no_longer_replays_still_shows_its_recorded_result(
    client: Client,
) -> None:
    """As after an incompatible change to the workflow code: the turn's last model call is
    recorded as another activity, so replay fails there. The view says so, and a completed
    turn still shows the result it recorded."""
    recorded = HISTORIES / "parallel_tools.json"
    history = WorkflowHistory.from_json("recorded", recorded.read_text(encoding="utf-8"))
    intact = await view_histories(client, [history])
    assert intact.warnings == [] and intact.result is not None
    assert intact.result.final is not None and intact.result.final.text == "Sums: 3, 7, 11."

    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "llm_step"
    ]
    scheduled[-1].activity_type.name = "renamed_step"

    view = await view_histories(client, [history])

    assert view.status == TurnStatus.COMPLETED
    (warning,) = view.warnings
    assert "does not replay against the current workflow code" in warning
    assert "NondeterminismError" in warning
    # Replay stopped at the renamed call, before the answer; the recorded result has it.
    assert view.result == intact.result
    assert view.stop_reason == StopReason.END_TURN
    # Timings come from the events, replay or not.
    assert [t.call_index for t in view.activities if t.activity == "llm_step"] == [1, 2]
    assert [t.activity for t in view.activities][-1] == "renamed_step"


async def test_show_a_turn_that_continued_as_new(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    """The latest run's state carries the whole turn; timings come from every run."""
    rounds = [calls((f"c{i}", "add", {"a": i, "b": i})) for i in range(6)]
    config = playback(tmp_path, *rounds, "All added.")
    async with harness(TOOLS, continue_as_new={"history_events": 40}, **config) as h:
        turn = await h.start("Add six pairs.")
        result = await turn.result()
    text, view = await show_both(turn.workflow_id, temporal, tmp_path)

    runs = view["runs"]
    assert len(runs) > 1  # the scenario is what its name says
    assert view["run_id"] == runs[-1]["run_id"] and view["status"] == "completed"
    assert view["started_at"] == runs[0]["started_at"]
    assert all(run["closed_at"] is not None for run in runs)
    assert shows(view, result)
    assert result.iterations == 6 and len(result.messages) == 14
    model_calls = [a for a in view["activities"] if a["activity"] == "llm_step"]
    assert [a["call_index"] for a in model_calls] == [1, 2, 3, 4, 5, 6, 7]
    assert len({a["run_id"] for a in model_calls}) > 1  # from the histories of several runs
    tool_calls = [a["call_id"] for a in view["activities"] if a["activity"] == "call_tool"]
    assert tool_calls == [f"c{i}" for i in range(6)]
    assert f"{len(runs)} runs (continued as new)" in text
    assert "model calls: 7 in" in text
    assert "assistant › All added." in text


async def test_show_an_earlier_turn_under_a_reused_workflow_id(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    config = playback(tmp_path, "an answer")
    workflow_id = f"reused-{uuid.uuid4().hex[:8]}"
    handles: list[TurnHandle] = []
    async with harness(TOOLS, **config) as h:
        for prompt in ("one", "two"):  # the id is free again once its turn has ended
            turn = TurnInput(agent="test", messages=[prompt])
            handles.append(
                await start_turn(h.client, turn, workflow_id=workflow_id, task_queue=h.task_queue)
            )
            await handles[-1].result()
    first, second = handles
    first_run = first.handle.first_execution_run_id
    assert first_run is not None and first_run != second.handle.first_execution_run_id

    latest = await show(workflow_id, temporal, tmp_path, json_out=True)
    earlier = await show(workflow_id, temporal, tmp_path, json_out=True, run_id=first_run)
    assert latest.returncode == 0 and earlier.returncode == 0, latest.stderr + earlier.stderr
    assert json.loads(latest.stdout)["result"]["messages"][0]["content"][0]["text"] == "two"
    view = json.loads(earlier.stdout)
    assert view["run_id"] == first_run
    assert view["result"]["messages"][0]["content"][0]["text"] == "one"
    unknown = await show(
        workflow_id, temporal, tmp_path, run_id="00000000-0000-0000-0000-000000000000"
    )
    assert unknown.returncode == 2 and "run 00000000" in unknown.stderr, unknown.stderr


# --- big and hostile turns --------------------------------------------------------------------

BIG = 2 * 1024 * 1024  # chars of the big tool result: well over the payload storage threshold


def big_result() -> str:
    """Returns a big text."""
    return "0123456789abcdef" * (BIG // 16 - 1) + "END-OF-RESULT..."


async def test_show_cuts_a_big_result_with_its_size_and_prints_it_whole_on_demand(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    config = playback(tmp_path, calls(("c1", "big_result", {})), "Done.")
    async with harness({"local": [big_result]}, **config) as h:
        turn = await h.start("Get the big one.")
        assert (await turn.result()).messages[2].tool_results["c1"].text.endswith("RESULT...")

    text, as_json, full = await asyncio.gather(
        show(turn.workflow_id, temporal, tmp_path),
        show(turn.workflow_id, temporal, tmp_path, json_out=True),
        show(turn.workflow_id, temporal, tmp_path, full=True),
    )
    for shown in (text, as_json, full):
        assert shown.returncode == 0, shown.stdout + shown.stderr
    # Cut, saying how big it is; whole with --full.
    assert "← local__big_result" in text.stdout and "END-OF-RESULT" not in text.stdout
    assert f"[cut: {BIG:,} chars in all; `turnkeep show --full` prints them whole]" in text.stdout
    assert len(text.stdout) < 10_000
    assert "0123456789abcdef" * (BIG // 16 - 1) + "END-OF-RESULT..." in full.stdout
    assert "[cut:" not in full.stdout
    # The JSON holds the result once (before: also in the result's history, twice the size).
    assert BIG < len(as_json.stdout) < BIG + 20_000
    view = json.loads(as_json.stdout)
    assert view["result"]["messages"][2]["tool_results"]["c1"]["content"][0]["text"][-9:] == (
        "RESULT..."
    )


HOSTILE_TIMINGS = [
    "not JSON at all {",
    "[1, 2, 3]",
    '"a string"',
    "null",
    '{"c1": 12}',
    '{"c1": {"timing_ms": "soon"}}',
    '{"c1": {"timing_ms": NaN}}',
    '{"c1": {"timing_ms": Infinity}}',
    '{"c1": {"timing_ms": -5}}',
    '{"c1": {"timing_ms": 1e400}}',
]


async def test_a_turn_whose_input_carries_garbage_channels_still_shows(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    """Channels in a turn's input are whatever its client wrote: `show` must print the turn
    whatever they hold, and send no control sequence from it to the terminal."""
    call = {"role": "assistant", **calls(("c1", "add", {"a": 1, "b": 2}))}
    async with harness(TOOLS, **playback(tmp_path, *["ok"] * len(HOSTILE_TIMINGS))) as h:
        turns = [
            await h.start(
                history=[{"role": "user", "content": [{"type": "text", "text": "add"}]}, call],
                messages=[
                    {
                        "role": "user",
                        "tool_results": {"c1": {"content": [{"type": "text", "text": "3"}]}},
                        "channels": {
                            "tool_timing": [{"type": "text", "text": timing}],
                            "error": [{"type": "text", "text": "\x1b[2Jcleared"}],
                            "usage": [{"type": "text", "text": "[]"}],
                        },
                    },
                    "and \x1b]0;retitled\x07 then?",
                ],
            )
            for timing in HOSTILE_TIMINGS
        ]
        for turn in turns:
            await turn.result()

    shown = await asyncio.gather(*(show(t.workflow_id, temporal, tmp_path) for t in turns))
    for timing, out in zip(HOSTILE_TIMINGS, shown, strict=True):
        assert out.returncode == 0, f"{timing}: {out.stdout}{out.stderr}"
        assert "← c1: 3" in out.stdout, out.stdout  # no time: the channel's is no time
        assert "user › and \\x1b]0;retitled\\x07 then?" in out.stdout
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout
