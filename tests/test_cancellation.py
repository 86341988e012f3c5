"""Cancelling turns on the real server (the documentation's *The turn loop*, *Cancellation and
repair* and *The Web UI*): every cancelled turn ends **Canceled** in Temporal with its
conversation repaired exactly as fast-agent repairs it, readable through ``TurnHandle.result()``
(``TurnCancelledError.result``) and ``TurnHandle.current()``; in-flight model and tool calls are
really abandoned, not left running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.plugin import SimplePlugin
from temporalio.service import RPCError
from temporalio.worker import Worker

from tests.conftest import HarnessFactory, eventually, make_settings, turnkeep, write_script
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.contract.activity_io import CALL_TOOL, LLM_STEP
from turnkeep.contract.messages import CallToolResult, Message, StopReason, ToolCall
from turnkeep.contract.turn_io import RollbackState, TurnCancelledError, TurnInput, TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing.fake_api import Api, FakeModelApi, Reply
from turnkeep.worker.build import build_worker
from turnkeep.worker.plugin import TurnkeepPlugin
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio


# --- tools -----------------------------------------------------------------------------------
# Function tools run in this process (an in-process FastMCP server), so they can report what
# happened to them through module-level state.

gate = asyncio.Event()
started: list[str] = []  # names of gated calls that began running
cancelled: list[str] = []  # names of gated calls whose coroutine saw asyncio.CancelledError


async def blocked(name: str) -> str:
    """Blocks until the test opens the gate."""
    started.append(name)
    try:
        await gate.wait()
    except asyncio.CancelledError:
        cancelled.append(name)
        raise
    return f"{name} passed"


def quick(name: str) -> str:
    """Returns at once."""
    return f"{name} done"


async def nap(name: str, ms: int) -> str:
    """Sleeps ``ms`` milliseconds."""
    await asyncio.sleep(ms / 1000)
    return f"{name} slept {ms}"


TOOLS: dict[str, list[Callable[..., Any]]] = {"local": [blocked, quick, nap]}
TOOL_NAMES = "local__blocked, local__nap, local__quick"


@pytest.fixture(autouse=True)
def fresh_tool_state() -> None:
    gate.clear()
    started.clear()
    cancelled.clear()


def playback(tmp_path: Path, *entries: Any, agent: str = "test") -> dict[str, Any]:
    script = write_script(tmp_path / f"{agent}.json", *entries)
    return {"model": "playback", "playback": str(script), "servers": ["local"]}


def calls(*specs: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    """A playback entry asking for tools: (call id, tool, arguments) each."""
    return {"tool_calls": {cid: {"name": tool, "arguments": args} for cid, tool, args in specs}}


# --- waiting on observable state (never on the clock alone) ----------------------------------


async def events(turn: TurnHandle) -> list[HistoryEvent]:
    return [event async for event in turn.handle.fetch_history_events()]


def scheduled(history: list[HistoryEvent]) -> dict[int, tuple[str, str | None]]:
    """Scheduled activities: event id → (activity type, tool call id if it is a tool call)."""
    found: dict[int, tuple[str, str | None]] = {}
    for event in history:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            call_id = None
            if attrs.activity_type.name == CALL_TOOL:
                call_id = json.loads(attrs.input.payloads[0].data)["call_id"]
            found[event.event_id] = (attrs.activity_type.name, call_id)
    return found


def tool_completed_and_seen(history: list[HistoryEvent], call_id: str) -> bool:
    """The tool call completed and a workflow task has run since, so the loop holds its result
    (a cancel arriving in the same workflow task as the completion is a different case)."""
    activities = scheduled(history)
    completed_at = None
    for event in history:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            scheduled_id = event.activity_task_completed_event_attributes.scheduled_event_id
            if activities[scheduled_id] == (CALL_TOOL, call_id):
                completed_at = event.event_id
        elif (
            event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
            and completed_at is not None
        ):
            return True
    return False


def cancel_requested_for(history: list[HistoryEvent]) -> list[tuple[str, str | None]]:
    """The activities the workflow asked the server to cancel."""
    activities = scheduled(history)
    return [
        activities[event.activity_task_cancel_requested_event_attributes.scheduled_event_id]
        for event in history
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
    ]


# --- reading a cancelled turn -----------------------------------------------------------------


async def cancelled_turn(turn: TurnHandle) -> TurnResult:
    """Wait for a cancelled turn to end; check it ended Canceled and that the result carried by
    ``TurnCancelledError`` is the one ``current()`` reads from the closed workflow."""
    with pytest.raises(TurnCancelledError) as raised:
        await turn.result()
    assert (await turn.handle.describe()).status == WorkflowExecutionStatus.CANCELED
    repaired = raised.value.result
    assert repaired is not None
    assert await turn.current() == repaired
    assert repaired.stop_reason == StopReason.CANCELLED
    return repaired


def shape(message: Message) -> tuple[Any, ...]:
    """A message as the test compares it: everything but the usage/timing channels."""
    results = {
        cid: (result.is_error, result.text) for cid, result in (message.tool_results or {}).items()
    }
    return (
        message.role,
        message.text,
        message.tool_calls,
        results or None,
        message.stop_reason,
    )


def tool_use(*specs: tuple[str, str, dict[str, Any]]) -> Message:
    return Message(
        role="assistant",
        tool_calls={cid: ToolCall(name=tool, arguments=args) for cid, tool, args in specs},
        stop_reason=StopReason.TOOL_USE,
    )


def results(**by_id: CallToolResult) -> Message:
    return Message(role="user", tool_results=by_id)


def interrupted() -> CallToolResult:
    return CallToolResult.error(INTERRUPTED_TEXT)


def ok(text: str) -> CallToolResult:
    return CallToolResult.model_validate({"content": [{"type": "text", "text": text}]})


def assert_conversation(actual: list[Message], expected: list[Message]) -> None:
    assert [shape(m) for m in actual] == [shape(m) for m in expected]


# --- 1. cancel while the model is thinking ---------------------------------------------------


class WatchedProvider(FakeModelApi):
    """The fake API, also noting each request the client hung up on before it was answered (a
    ``Reply.delay`` ends early when the client closes the connection)."""

    def __init__(self) -> None:
        super().__init__()
        self.hangups: list[float] = []  # time.monotonic() of each hang-up

    async def _answer(
        self,
        path: str,
        headers: dict[str, str],
        body: Any,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        answered = await super()._answer(path, headers, body, reader, writer)
        if not answered:
            self.hangups.append(time.monotonic())
        return answered


@pytest.fixture(scope="module")
def provider() -> Iterator[WatchedProvider]:
    watched = WatchedProvider()
    with watched:
        yield watched


@pytest.fixture
def fake(provider: WatchedProvider) -> WatchedProvider:
    provider.reset()
    provider.hangups.clear()
    return provider


def provider_config(api: Api, fake: FakeModelApi) -> dict[str, Any]:
    base_url = fake.base_url_anthropic if api == "anthropic" else fake.base_url_openai
    return {
        api: {"api_key": "sk-test", "base_url": base_url},
        "agents": {
            "test": {
                "model": f"{api}.test-model",
                "servers": ["local"],
                # A 60 s answer fits: only the cancel can end the call early.
                "llm_timeouts": {"start_to_close": 120, "heartbeat": 5, "max_attempts": 1},
            }
        },
    }


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_cancel_during_a_model_call_leaves_history_unchanged_and_abandons_the_request(
    api: Api, fake: WatchedProvider, harness: HarnessFactory
) -> None:
    fake.script(Reply.delay(60, then=Reply.text("too late")), api=api)
    async with harness(TOOLS, **provider_config(api, fake)) as h:
        turn = await h.start("What is 2+2?")
        await eventually(lambda: fake.requests_for(api), "the model request arrived")
        await turn.cancel()
        repaired = await cancelled_turn(turn)

        # The SDK request was abandoned: the client hung up on the fake API long before its
        # 60 s answer (the activity heard of the cancel through its heartbeat).
        hangup = await eventually(lambda: fake.hangups, "the client hung up", within=30)
        (request,) = fake.requests_for(api)  # and it was not retried
        assert hangup[0] - request.at < 45
        assert cancel_requested_for(await events(turn)) == [(LLM_STEP, None)]

    assert repaired.rollback == RollbackState.HISTORY_UNCHANGED
    assert repaired.messages == [Message.user("What is 2+2?")]
    assert repaired.history == repaired.messages
    assert repaired.final is None
    assert repaired.iterations == 0


# --- 2. cancel while one tool runs ------------------------------------------------------------


async def test_cancel_during_a_tool_call_appends_an_interrupted_result_and_cancels_the_tool(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    call = ("c1", "local__blocked", {"name": "single"})
    agent = playback(tmp_path, calls(call), "never reached")
    async with harness(TOOLS, agents={"test": agent}) as h:
        turn = await h.start("go")
        first = await anext(turn.messages())
        assert first.tool_calls is not None and list(first.tool_calls) == ["c1"]
        await eventually(lambda: "single" in started, "the tool started")
        await turn.cancel()
        repaired = await cancelled_turn(turn)
        # The cancel reached the tool's coroutine through the activity's heartbeat (function
        # tools are called in process, so cancelling the activity cancels the coroutine).
        await eventually(lambda: "single" in cancelled, "the tool coroutine was cancelled")
        assert cancel_requested_for(await events(turn)) == [(CALL_TOOL, "c1")]

    assert repaired.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    assert_conversation(
        repaired.messages,
        [Message.user("go"), tool_use(call), results(c1=interrupted())],
    )
    # The repair message is exactly fast-agent's: one user message, the marker per open call id.
    assert repaired.messages[-1] == results(c1=interrupted())
    assert repaired.history == repaired.messages
    assert repaired.final is not None and repaired.final.tool_calls == first.tool_calls
    assert repaired.iterations == 0


# --- 3. cancel while parallel tools run, some finished ----------------------------------------


async def test_cancel_during_parallel_tools_keeps_every_completed_result(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    batch = [
        ("c1", "local__quick", {"name": "q"}),
        ("c2", "local__blocked", {"name": "b2"}),
        ("c3", "local__blocked", {"name": "b3"}),
        ("c4", "local__nope", {}),
    ]
    agent = playback(tmp_path, calls(*batch), "never reached")
    async with harness(TOOLS, agents={"test": agent}) as h:
        turn = await h.start("go")
        await anext(turn.messages())
        await eventually(lambda: {"b2", "b3"} <= set(started), "both gated tools started")
        await eventually(lambda: _seen(turn, "c1"), "the workflow received the quick tool's result")
        await turn.cancel()
        repaired = await cancelled_turn(turn)
        await eventually(
            lambda: {"b2", "b3"} <= set(cancelled), "both gated tool coroutines were cancelled"
        )
        assert sorted(cancel_requested_for(await events(turn))) == [
            (CALL_TOOL, "c2"),
            (CALL_TOOL, "c3"),
        ]

    not_available = CallToolResult.error(
        f"Tool 'local__nope' is not available. Available tools: {TOOL_NAMES}."
    )
    assert repaired.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    assert_conversation(
        repaired.messages,
        [
            Message.user("go"),
            tool_use(*batch),
            results(c1=ok("q done"), c2=interrupted(), c3=interrupted(), c4=not_available),
        ],
    )
    repair = repaired.messages[-1].tool_results
    assert repair is not None
    assert list(repair) == ["c1", "c2", "c3", "c4"]  # in call order
    # The unknown tool's answer is a real, completed result: kept verbatim, not "interrupted".
    assert repair["c4"] == not_available
    assert repair["c2"] == repair["c3"] == interrupted()
    assert repaired.history == repaired.messages


async def _seen(turn: TurnHandle, call_id: str) -> bool:
    return tool_completed_and_seen(await events(turn), call_id)


# --- 4. cancel after a batch completed ---------------------------------------------------------


async def test_cancel_during_the_follow_up_model_call_keeps_the_real_results(
    fake: WatchedProvider, harness: HarnessFactory
) -> None:
    """The batch's results are already appended when the next model call starts, so the
    conversation ends on them and the repair has nothing to add: ``history_unchanged`` (the
    state fast-agent's ``reconcile_interrupted_history`` reports for a history that does not
    end on a tool request)."""
    fake.script(
        Reply.tool_calls(("call_1", "local__quick", {"name": "q"})),
        Reply.delay(60, then=Reply.text("too late")),
        api="anthropic",
    )
    async with harness(TOOLS, **provider_config("anthropic", fake)) as h:
        turn = await h.start("Be quick")
        await eventually(
            lambda: len(fake.requests_for("anthropic")) == 2, "the follow-up call was sent"
        )
        await turn.cancel()
        repaired = await cancelled_turn(turn)
        await eventually(lambda: fake.hangups, "the follow-up request was abandoned")
        assert cancel_requested_for(await events(turn)) == [(LLM_STEP, None)]

    assert repaired.rollback == RollbackState.HISTORY_UNCHANGED
    assert_conversation(
        repaired.messages,
        [
            Message.user("Be quick"),
            tool_use(("call_1", "local__quick", {"name": "q"})),
            results(call_1=ok("q done")),
        ],
    )
    last = repaired.messages[-1]
    assert last.channel_json("tool_timing") is not None  # appended by the loop, not by repair
    assert repaired.iterations == 1


def activities_only(client: Client, settings: Any, task_queue: str) -> Worker:
    """A worker that runs turnkeep's activities but never a workflow task."""
    return Worker(
        client,
        task_queue=task_queue,
        plugins=[
            TurnkeepPlugin(settings, function_tools=TOOLS),
            SimplePlugin("activities-only", workflows=lambda _registered: []),
        ],
    )


async def test_cancel_between_a_completed_batch_and_the_loop_appends_the_completed_results(
    client: Client, tmp_path: Path
) -> None:
    """The "between steps" case made deterministic: workflow tasks and activities run on
    separate workers; with no workflow worker up, the tool finishes (its completion is in the
    history) and then the turn is cancelled, so the workflow learns both at once."""
    call = ("c1", "local__blocked", {"name": "between"})
    settings = make_settings(tmp_path, agents={"test": playback(tmp_path, calls(call), "later")})
    task_queue = f"test-{uuid.uuid4().hex[:10]}"

    def workflows_only() -> Worker:
        return build_worker(
            client, settings, function_tools=TOOLS, task_queue=task_queue, no_remote_activities=True
        )

    async with activities_only(client, settings, task_queue):
        async with workflows_only():
            turn = await start_turn(
                client, TurnInput(agent="test", messages=["go"]), task_queue=task_queue
            )
            await anext(turn.messages())
            await eventually(lambda: "between" in started, "the tool started")
        gate.set()  # no workflow worker now: the completion waits in history
        await eventually(lambda: _completed(turn, "c1"), "the tool's completion was recorded")
        await turn.cancel()
        async with workflows_only():
            repaired = await cancelled_turn(turn)

    assert repaired.rollback == RollbackState.APPENDED_COMPLETED_TOOL_RESULT
    assert_conversation(
        repaired.messages,
        [Message.user("go"), tool_use(call), results(c1=ok("between passed"))],
    )


async def _completed(turn: TurnHandle, call_id: str) -> bool:
    history = await events(turn)
    activities = scheduled(history)
    return any(
        event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and activities[event.activity_task_completed_event_attributes.scheduled_event_id]
        == (CALL_TOOL, call_id)
        for event in history
    )


# --- 5. property: cancelled at any moment, the conversation is always well formed ---------------


TURNS = 12


def random_script(rng: random.Random, turn: int) -> list[Any]:
    """Three iterations of 1–3 parallel naps (300–600 ms), then a final answer.

    The naps make a turn last at least 0.9 s on any machine, so that most random moments
    below fall inside its loop rather than after it ended.
    """
    entries: list[Any] = []
    for iteration in range(3):
        specs = [
            (
                f"t{turn}i{iteration}c{k}",
                "local__nap",
                {"name": f"n{k}", "ms": rng.randint(300, 600)},
            )
            for k in range(rng.randint(1, 3))
        ]
        entries.append(calls(*specs))
    entries.append(f"turn {turn} done")
    return entries


def check_well_formed(result: TurnResult, was_cancelled: bool, context: str) -> None:
    history = result.history
    assert history, context
    last = history[-1]
    assert not (last.role == "assistant" and last.stop_reason == StopReason.TOOL_USE), context
    answered: list[str] = []
    for index, message in enumerate(history):
        if message.tool_results:
            # A results message answers exactly the calls of the message right before it.
            previous = history[index - 1] if index else None
            assert previous is not None and previous.tool_calls, context
            assert list(message.tool_results) == list(previous.tool_calls), context
            answered += list(message.tool_results)
        if message.tool_calls and message.stop_reason == StopReason.TOOL_USE:
            following = history[index + 1] if index + 1 < len(history) else None
            assert following is not None and following.tool_results is not None, context
    called = [cid for m in history for cid in (m.tool_calls or {})]
    assert sorted(answered) == sorted(called) and len(set(called)) == len(called), context
    marked = [
        cid
        for m in history
        for cid, r in (m.tool_results or {}).items()
        if r.text == INTERRUPTED_TEXT
    ]
    if was_cancelled:
        assert result.stop_reason == StopReason.CANCELLED, context
        assert result.rollback in {
            RollbackState.HISTORY_UNCHANGED,
            RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT,
            RollbackState.APPENDED_COMPLETED_TOOL_RESULT,
        }, context
        # Only the repair message (always the last one) may carry the marker.
        if marked:
            assert result.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT, context
            assert set(marked) <= set(last.tool_results or {}), context
    else:
        assert result.stop_reason == StopReason.END_TURN and result.rollback is None, context
        assert not marked and result.iterations == 3, context


async def test_turns_cancelled_at_random_moments_always_leave_a_well_formed_history(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    seed = int(os.environ.get("TURNKEEP_CANCEL_SEED", random.randrange(2**32)))
    print(f"cancellation property test seed: {seed} (rerun with TURNKEEP_CANCEL_SEED={seed})")
    rng = random.Random(seed)
    agents = {
        f"p{n}": playback(tmp_path, *random_script(rng, n), agent=f"p{n}") for n in range(TURNS)
    }
    delays = [rng.uniform(0.0, 2.0) for _ in range(TURNS)]

    async def one(h: Any, n: int) -> tuple[str, TurnResult | None]:
        turn = await h.start("go", agent=f"p{n}")
        await asyncio.sleep(delays[n])  # the random moment is the point of this test
        with contextlib.suppress(RPCError):  # it may have finished first
            await turn.cancel()
        try:
            result = await turn.result()
        except TurnCancelledError as err:
            assert (await turn.handle.describe()).status == WorkflowExecutionStatus.CANCELED
            assert err.result == await turn.current()
            if err.result is None:
                # Cancelled while preparing the turn, before its loop state existed: nothing
                # was asked of the model, so there is no conversation to repair.
                assert LLM_STEP not in {kind for kind, _ in scheduled(await events(turn)).values()}
                return "cancelled before the loop", None
            return "cancelled", err.result
        assert (await turn.handle.describe()).status == WorkflowExecutionStatus.COMPLETED
        return "completed", result

    async with harness(TOOLS, agents=agents) as h:
        outcomes = await asyncio.gather(*(one(h, n) for n in range(TURNS)))

    for delay, (outcome, result) in zip(delays, outcomes, strict=True):
        print(f"cancel after {delay:.1f} s: {outcome}", result and result.rollback)
    for n, (outcome, result) in enumerate(outcomes):
        if result is not None:
            context = f"seed {seed}, turn p{n} {outcome} after {delays[n]:.2f} s: {result.history}"
            check_well_formed(result, outcome == "cancelled", context)
    assert any(outcome == "cancelled" for outcome, _ in outcomes), f"seed {seed}: none cancelled"


# --- 6. auto-heal -----------------------------------------------------------------------------


@pytest.mark.parametrize("use_history", [True, False])
async def test_auto_heal_of_a_dangling_history_follows_use_history(
    use_history: bool, fake: WatchedProvider, harness: HarnessFactory
) -> None:
    dangling = [Message.user("go"), tool_use(("c9", "local__quick", {"name": "x"}))]
    fake.script(Reply.text("continuing"), api="anthropic")
    config = provider_config("anthropic", fake)
    config["agents"]["test"]["overrides"] = ["use_history"]
    async with harness(TOOLS, **config) as h:
        result = await h.run(
            "again", history=[m.model_dump() for m in dangling], use_history=use_history
        )
    (request,) = fake.requests_for("anthropic")
    sent = request.body["messages"]
    assert result.stop_reason == StopReason.END_TURN

    if use_history:
        heal = results(c9=interrupted())
        assert result.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
        assert result.messages[0] == heal
        assert_conversation(
            result.messages, [heal, Message.user("again"), Message.assistant("continuing")]
        )
        assert result.history == dangling + result.messages
        # The model saw the repaired conversation: the call, then its interrupted result.
        assert INTERRUPTED_TEXT in json.dumps(sent) and "c9" in json.dumps(sent)
    else:
        # History is off: nothing of it reaches the model, so nothing is healed.
        assert result.rollback is None
        assert_conversation(
            result.messages, [Message.user("again"), Message.assistant("continuing")]
        )
        assert result.history == dangling
        assert len(sent) == 1 and "c9" not in json.dumps(sent)


# --- 7. watching a turn across a worker restart -----------------------------------------------


async def test_the_message_iterator_survives_a_worker_restart(
    client: Client, tmp_path: Path
) -> None:
    call = ("c1", "local__blocked", {"name": "restart"})
    settings = make_settings(tmp_path, agents={"test": playback(tmp_path, calls(call), "all done")})
    task_queue = f"test-{uuid.uuid4().hex[:10]}"

    def new_worker() -> Worker:
        return build_worker(client, settings, function_tools=TOOLS, task_queue=task_queue)

    async with new_worker():  # worker A
        turn = await start_turn(
            client, TurnInput(agent="test", messages=["go"]), task_queue=task_queue
        )
        stream = turn.messages(include_tool_results=True)
        first = await anext(stream)
        await eventually(lambda: "restart" in started, "the tool started on worker A")
        # The iterator is asking for the next message when worker A goes away.
        pending = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
    # Worker A's shutdown cancelled the running tool; the turn itself carries on.
    assert "restart" in cancelled
    assert not pending.done()
    gate.set()

    async with new_worker():  # worker B, same task queue
        rest = [await asyncio.wait_for(pending, 120)] + [m async for m in stream]
        result = await turn.result()

    assert_conversation(
        [first, *rest],
        [tool_use(call), results(c1=ok("restart passed")), Message.assistant("all done")],
    )
    assert [first, *rest] == result.messages[1:]  # each message exactly once, in order
    assert result.stop_reason == StopReason.END_TURN and result.rollback is None
    # It asked by query: the turn's history has no trace of it.
    accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    assert not any(event.event_type == accepted for event in await events(turn))


# --- 8. the CLI ----------------------------------------------------------------------------------


async def test_cli_cancel_prints_the_repair_and_the_turn_ends_canceled(
    harness: HarnessFactory, temporal: ServerInfo, tmp_path: Path
) -> None:
    call = ("c1", "local__blocked", {"name": "cli"})
    agent = playback(tmp_path, calls(call), "never reached")
    async with harness(TOOLS, agents={"test": agent}) as h:
        turn = await h.start("go")
        await anext(turn.messages())
        await eventually(lambda: "cli" in started, "the tool started")
        # The in-process worker keeps running (this loop is free) to answer the CLI's query.
        ran = await asyncio.to_thread(
            turnkeep, "cancel", turn.workflow_id, temporal=temporal, cwd=tmp_path
        )
        repaired = await cancelled_turn(turn)

    assert ran.returncode == 0, ran.stderr
    assert "history repair: appended_interrupted_tool_result" in ran.stdout
    assert "stop reason: cancelled" in ran.stdout
    assert repaired.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    assert repaired.messages[-1] == results(c1=interrupted())
