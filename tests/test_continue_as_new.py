"""Continue-as-new in the middle of a turn (issue 7, item 2).

A run whose history reaches the worker's ``continue_as_new`` limits hands the turn to a fresh
run of the same workflow id between two steps, carrying the loop state. The tests set tiny
limits (``history_events: 1`` cuts after every step) and check, on a real server, that:

- the server shows the chain of runs (ContinuedAsNew, …, then Completed or Canceled);
- the turn's result is the one the same scripted turn gives in a single run;
- the server's own suggestion (``is_continue_as_new_suggested``) cuts too, unless turned off;
- a tool request pending at the cut runs in the next run, exactly once;
- compaction state is carried: a later run's summary starts from an earlier run's;
- with payload storage off, a state too big to carry inline stays in its run (no stuck turn);
- watchers started before the first cut see every assistant message once, in order, and one
  waiting for a message far ahead is let go by each cut and follows the turn to its end;
- a cancel after several cuts repairs the conversation of the whole turn;
- a worker SIGKILLed while a continued run's model call is in flight is replaced, and the
  retried call reads its input from that run (by query) and the turn ends as it should;
- ``turnkeep run`` streams a continued turn to its end, and ``turnkeep show`` shows all of it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from tests.conftest import HarnessFactory, eventually, make_settings, turnkeep, write_script
from tests.test_compaction import TOOLS as MATH
from tests.test_compaction import config as compaction_config
from tests.test_durability import FAST_RECOVERY, TOOL, assert_ran, effect, stable
from tests.test_payload_storage import agent as storage_agent
from tests.test_payload_storage import calls
from tests.test_payload_storage import turnkeep as storage_harness
from tests.worker_process import WorkerProcesses, effects_server, write_config
from turnkeep.client.connection import connect
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.turn_io import (
    RollbackState,
    TurnCancelledError,
    TurnInput,
    TurnProgress,
    TurnResult,
    Usage,
)
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.payloads.limits import RESULT_TOO_LARGE
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.worker.build import build_worker
from turnkeep.worker.plugin import PAYLOAD_LIMIT_BYTES, FunctionTools
from turnkeep.workflows.loop import SUMMARY_PREFIX
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio

EVERY_STEP = {"history_events": 1}  # every step's end finds the run "full": cut after each
DEMO_TOOLS = Path(__file__).resolve().parents[1] / "examples" / "demo_tools.py"

# -- local function tools ---------------------------------------------------------------------

ran: Counter[str] = Counter()  # executions per tag, across every run of a turn
gate = asyncio.Event()
gate_reached = asyncio.Event()


def count(tag: str) -> str:
    """Counts its executions."""
    ran[tag] += 1
    return f"{tag} counted"


async def gated(size: int) -> str:
    """Waits for the test's gate, then returns ``size`` characters."""
    gate_reached.set()
    await gate.wait()
    return "x" * size


TOOLS: FunctionTools = {"local": [count, gated]}


def counts(*tags: str) -> dict[str, Any]:
    """An assistant message calling ``count`` once per tag (in parallel when several)."""
    return {
        "tool_calls": {
            f"call-{tag}": {"name": "local__count", "arguments": {"tag": tag}} for tag in tags
        }
    }


def gated_call(size: int = 0) -> dict[str, Any]:
    return {"tool_calls": {"call-gate": {"name": "local__gated", "arguments": {"size": size}}}}


def scripted(tmp_path: Path, *entries: Any, **top: Any) -> dict[str, Any]:
    script = write_script(tmp_path / f"script-{uuid.uuid4().hex[:6]}.json", *entries)
    agent = {"model": "playback", "playback": str(script), "servers": ["local"]}
    return {"agents": {"test": agent}, **top}


def assistants(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.role == "assistant"]


def reported_usage(result: TurnResult) -> Usage:
    """The usage each model answer of the turn reported, added up."""
    total = Usage()
    for message in assistants(result.messages):
        total += Usage.model_validate({**message.channel_json("usage"), "calls": 1})
    return total


# -- the chain of runs, as the server has it --------------------------------------------------


@dataclass
class Run:
    run_id: str
    events: list[HistoryEvent]

    @property
    def ended(self) -> EventType.ValueType:
        return self.events[-1].event_type

    def activities(self) -> list[str]:
        """The activity types this run scheduled, in order."""
        scheduled = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        return [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in self.events
            if e.event_type == scheduled
        ]


async def chain(client: Client, workflow_id: str) -> list[Run]:
    """Every run of the turn, first to last: from the first run (which every run's start event
    names), following each run's ContinuedAsNew event."""
    latest = client.get_workflow_handle(workflow_id)
    run_id: str | None = None
    async for started in latest.fetch_history_events():
        attrs = started.workflow_execution_started_event_attributes
        run_id = attrs.first_execution_run_id
        break
    runs: list[Run] = []
    while run_id:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        events = [e async for e in handle.fetch_history_events()]
        runs.append(Run(run_id, events))
        last = events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
            else None
        )
    return runs


async def listed(client: Client, workflow_id: str, runs: int) -> list[WorkflowExecutionStatus]:
    """The statuses ``list_workflows`` shows for the turn's runs, oldest first, once it lists
    all ``runs`` of them as closed (visibility lags the histories a little)."""

    async def probe() -> list[WorkflowExecutionStatus] | None:
        found = [w async for w in client.list_workflows(f"WorkflowId='{workflow_id}'")]
        statuses = [w.status for w in sorted(found, key=lambda w: w.start_time)]
        closed = all(s not in (None, WorkflowExecutionStatus.RUNNING) for s in statuses)
        return [s for s in statuses if s is not None] if len(found) == runs and closed else None

    statuses: list[WorkflowExecutionStatus] = await eventually(
        probe, f"visibility lists the {runs} runs of {workflow_id}, all closed"
    )
    return statuses


async def updates(client: Client, run: Run) -> list[tuple[int, TurnProgress | None]]:
    """Each ``wait_for_messages`` update this run accepted: its ``after`` argument, and what
    the run answered (None if the run closed first)."""
    accepted: dict[str, int] = {}
    answered: dict[str, TurnProgress] = {}
    converter = client.data_converter
    for event in run.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            (after,) = await converter.decode(request.input.args.payloads, [int])
            accepted[request.meta.update_id] = after
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            attrs = event.workflow_execution_update_completed_event_attributes
            payloads = attrs.outcome.success.payloads
            (progress,) = await converter.decode(payloads, [TurnProgress])
            answered[attrs.meta.update_id] = progress
    return [(after, answered.get(update_id)) for update_id, after in accepted.items()]


# -- the turn is the same, however many runs it takes -----------------------------------------

LONG_SCRIPT = [
    *(counts(f"t{i}a", f"t{i}b") if i % 3 == 0 else counts(f"t{i}") for i in range(12)),
    "all counted",
]


async def test_a_long_turn_continues_as_new_and_ends_as_in_one_run(
    harness: HarnessFactory, client: Client, tmp_path: Path
) -> None:
    ran.clear()
    async with harness(TOOLS, **scripted(tmp_path, *LONG_SCRIPT)) as h:
        single = await h.run("count")
    limit = 25
    config = scripted(tmp_path, *LONG_SCRIPT, continue_as_new={"history_events": limit})
    async with harness(TOOLS, **config) as h:
        turn = await h.start("count")
        continued = await turn.result()
    runs = await chain(client, turn.workflow_id)

    # The same turn: messages (less tool timings), iterations, usage, stop reason.
    assert stable(continued.messages) == stable(single.messages)
    assert stable(continued.history) == stable(single.history)
    assert continued.iterations == single.iterations == 12
    # Usage adds up over all runs. (Input tokens can differ from the single run's by a few:
    # playback counts the conversation's tool timings, whose digits vary from run to run.)
    assert continued.usage == {"playback": reported_usage(continued)}
    assert continued.usage["playback"].calls == single.usage["playback"].calls == 13
    assert continued.usage["playback"].output_tokens == single.usage["playback"].output_tokens
    assert continued.stop_reason == single.stop_reason == StopReason.END_TURN
    assert continued.final is not None and continued.final.text == "all counted"
    assert all(n == 2 for n in ran.values()) and len(ran) == 16  # once in each turn

    # Several runs; each cut once its history had reached the limit.
    cut = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    assert len(runs) >= 4
    assert [r.ended for r in runs[:-1]] == [cut] * (len(runs) - 1)
    assert runs[-1].ended == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    assert all(len(r.events) >= limit for r in runs[:-1])
    # The plan and the tool list are carried: only the first run asks for them.
    assert runs[0].activities()[:2] == ["prepare_turn", "list_tools"]
    later = {name for r in runs[1:] for name in r.activities()}
    assert later <= {"llm_step", "call_tool"}
    # Every model call and tool call was scheduled once, in whichever run it fell.
    every = [name for r in runs for name in r.activities()]
    assert every.count("llm_step") == 13 and every.count("call_tool") == 16

    statuses = await listed(client, turn.workflow_id, len(runs))
    assert statuses == [WorkflowExecutionStatus.CONTINUED_AS_NEW] * (len(runs) - 1) + [
        WorkflowExecutionStatus.COMPLETED
    ]


SUGGEST_AT = 20  # events


class SuggestingServer(EmbeddedServer):
    """A dev server that suggests continue-as-new once a run's history has SUGGEST_AT events
    (production servers do at thousands, by default)."""

    def argv(self) -> list[str]:
        value = f"limit.historyCount.suggestContinueAsNew={SUGGEST_AT}"
        return [*super().argv(), "--dynamic-config-value", value]


@pytest.mark.server
async def test_the_servers_suggestion_alone_continues_as_new_unless_told_not_to(
    tmp_path: Path,
) -> None:
    script = [*(counts(f"s{i}") for i in range(6)), "suggested"]
    outcomes: dict[bool, tuple[TurnResult, list[Run]]] = {}
    async with SuggestingServer(ui=False) as info:
        client = await connect(info.address, info.namespace)
        for when_suggested in (True, False):
            # No limits of turnkeep's own: only the server's suggestion can cut.
            limits = {"history_bytes": None, "history_events": None}
            config = {**limits, "when_suggested": when_suggested}
            settings = make_settings(
                tmp_path, **scripted(tmp_path, *script, continue_as_new=config)
            )
            task_queue = f"suggested-{uuid.uuid4().hex[:8]}"
            async with build_worker(client, settings, function_tools=TOOLS, task_queue=task_queue):
                turn = await start_turn(
                    client, TurnInput(agent="test", messages=["go"]), task_queue=task_queue
                )
                result = await turn.result()
            outcomes[when_suggested] = result, await chain(client, turn.workflow_id)

    (followed, followed_runs), (ignored, ignored_runs) = outcomes[True], outcomes[False]
    assert len(followed_runs) >= 3 and len(ignored_runs) == 1
    assert all(len(r.events) >= SUGGEST_AT for r in followed_runs[:-1])
    assert len(ignored_runs[0].events) > 2 * SUGGEST_AT  # suggested, and ignored as asked
    assert stable(followed.messages) == stable(ignored.messages)


async def test_a_tool_request_pending_at_the_cut_runs_once_in_the_next_run(
    harness: HarnessFactory, client: Client, tmp_path: Path
) -> None:
    ran.clear()
    script = [counts("p1"), counts("p2", "p3"), counts("p4"), "done"]
    async with harness(TOOLS, **scripted(tmp_path, *script, continue_as_new=EVERY_STEP)) as h:
        turn = await h.start("go")
        result = await turn.result()
    runs = await chain(client, turn.workflow_id)

    # One step per run: the model's tool request is cut from the tools that answer it, and
    # the next run starts with exactly those tools (no model call first, none repeated).
    assert [r.activities() for r in runs] == [
        ["prepare_turn", "list_tools", "llm_step"],
        ["call_tool"],
        ["llm_step"],
        ["call_tool", "call_tool"],
        ["llm_step"],
        ["call_tool"],
        ["llm_step"],
    ]
    assert ran == {"p1": 1, "p2": 1, "p3": 1, "p4": 1}
    answers = [m.tool_results for m in result.messages if m.tool_results]
    assert [{cid: r.text for cid, r in a.items()} for a in answers] == [
        {"call-p1": "p1 counted"},
        {"call-p2": "p2 counted", "call-p3": "p3 counted"},
        {"call-p4": "p4 counted"},
    ]
    assert result.iterations == 3 and result.final is not None and result.final.text == "done"


async def test_compaction_state_is_carried_across_runs(
    fake: FakeModelApi, harness: HarnessFactory, client: Client
) -> None:
    """One step per run, and a window so small that every follow-up call compacts what it
    can: the second summary (in a later run than the first) must start from the first one,
    which only the carried compaction state knows about."""
    fake.script(
        Reply.tool_calls(("c1", "math__add", {"a": 1, "b": 2})),
        Reply.tool_calls(("c2", "math__add", {"a": 3, "b": 4})),
        Reply.text("Summary one: 1+2 is 3."),
        Reply.tool_calls(("c3", "math__add", {"a": 5, "b": 6})),
        Reply.text("Summary two: 3, then 7."),
        Reply.text("Done: 3, 7 and 11."),
        api="anthropic",
    )
    config = {**compaction_config(fake), "continue_as_new": EVERY_STEP}
    async with harness(MATH, **config) as h:
        turn = await h.start("Add 1+2, then 3+4, then 5+6.")
        result = await turn.result()
    runs = await chain(client, turn.workflow_id)

    assert [r.activities() for r in runs] == [
        ["prepare_turn", "list_tools", "llm_step"],
        ["call_tool"],
        ["llm_step"],
        ["call_tool"],
        ["compact_history", "llm_step"],
        ["call_tool"],
        ["compact_history", "llm_step"],
    ]
    requests = fake.requests_for("anthropic")
    second_summary, final = json.dumps(requests[4].body), requests[5].body["messages"]
    assert "Summary one: 1+2 is 3." in second_summary
    assert "Add 1+2, then 3+4, then 5+6." not in second_summary
    assert final[0]["content"][0]["text"] == SUMMARY_PREFIX + "Summary two: 3, then 7."
    assert [m["role"] for m in final] == ["user", "assistant", "user"]
    assert result.history[0].text == SUMMARY_PREFIX + "Summary two: 3, then 7."
    assert len(result.messages) == 8  # the turn's own record keeps everything
    assert result.final is not None and result.final.text == "Done: 3, 7 and 11."


async def test_without_payload_storage_a_state_too_big_to_carry_stays_in_its_run(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    """Payload storage off: a new run's input is recorded inline, so once the turn's state
    nears Temporal's 2 MB payload limit the turn stops continuing as new and goes on in its
    run. It then ends as a one-run turn that large does: failed, saying why (its result is
    over the limit), rather than stuck retrying a continue-as-new the server refuses."""
    # Ten results of 300 KB, each cut to the inline limit (256 KB) on its way into history.
    blobs = [calls((f"c{i}", "local__blob", {"i": i, "kb": 300})) for i in range(10)]
    config = {
        "agents": storage_agent(write_script(tmp_path / "blobs.json", *blobs, "done")),
        "payload_storage": {"driver": "off"},
        "continue_as_new": EVERY_STEP,
    }
    async with storage_harness(temporal, tmp_path, **config) as h:
        turn = await h.start("go")
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(turn.result(), 120)
    runs = await chain(client, turn.workflow_id)

    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == RESULT_TOO_LARGE
    *continued, last = runs
    # One step per run while the state fits in a payload...
    assert len(continued) >= 10
    assert all(len(r.activities()) == 1 for r in continued[1:])
    # ...then every remaining step in one run, which ended failed, not stuck.
    assert last.ended == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED
    assert last.activities().count("llm_step") >= 2
    inputs = [r.events[0].workflow_execution_started_event_attributes.input for r in runs]
    assert max(i.ByteSize() for i in inputs) < PAYLOAD_LIMIT_BYTES


# -- watchers ------------------------------------------------------------------------------

BULK = 32 * 1024  # the gated tool's result: enough to pass the byte limit below at once
FAR = 5  # a watcher that starts at message 5 waits in the first run for messages far ahead


async def collect(stream: AsyncIterator[Message]) -> list[Message]:
    return [m async for m in stream]


async def test_watchers_started_before_the_first_cut_follow_the_turn_to_its_end(
    harness: HarnessFactory, client: Client, tmp_path: Path
) -> None:
    """The first run waits on a gated tool while two watchers attach: one from the start, one
    from message FAR (not there yet). The tool's big result passes the byte limit, and from
    then on every run starts over it, so every step ends in a cut."""
    gate.clear()
    script = [gated_call(BULK), *(counts(f"w{i}") for i in range(5)), "done watching"]
    config = scripted(tmp_path, *script, continue_as_new={"history_bytes": 24 * 1024})
    async with harness(TOOLS, **config) as h:
        turn = await h.start("go")
        near = turn.messages()
        first = await anext(near)  # the gated call, from the first run: no cut yet
        far = asyncio.ensure_future(collect(turn.messages(FAR)))
        await asyncio.sleep(0)  # the far watcher starts asking while the first run waits
        first_run = await chain(client, turn.workflow_id)
        assert len(first_run) == 1 and not far.done()
        gate.set()
        # Bounded: a watcher left waiting in a run would keep that run from continuing.
        rest = await asyncio.wait_for(collect(near), 120)
        from_far = await asyncio.wait_for(far, 120)
        result = await turn.result()
    runs = await chain(client, turn.workflow_id)

    assert [first, *rest] == assistants(result.messages)  # each exactly once, in order
    assert from_far == assistants(result.messages[FAR:])
    assert len(runs) >= 5
    # The watchers asked by query: none of the runs recorded anything of them.
    for run in runs:
        assert await updates(client, run) == []


# -- cancelling a continued turn --------------------------------------------------------------


async def test_cancel_after_continuing_as_new_repairs_the_whole_turn(
    harness: HarnessFactory, client: Client, tmp_path: Path
) -> None:
    ran.clear()
    gate.clear()
    gate_reached.clear()
    script = [counts("k1"), counts("k2"), gated_call(), "never reached"]
    async with harness(TOOLS, **scripted(tmp_path, *script, continue_as_new=EVERY_STEP)) as h:
        turn = await h.start("go")
        await asyncio.wait_for(gate_reached.wait(), 60)  # in its sixth run, the tool waits
        await turn.cancel()
        with pytest.raises(TurnCancelledError) as cancelled:
            await turn.result()
        current = await turn.current()
    gate.set()
    runs = await chain(client, turn.workflow_id)

    repaired = cancelled.value.result
    assert repaired is not None and repaired == current
    assert repaired.stop_reason == StopReason.CANCELLED
    assert repaired.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    # The whole turn, from its first run on: prompt, two tool rounds, the gated call, repair.
    assert [m.role for m in repaired.messages] == ["user"] + ["assistant", "user"] * 3
    assert repaired.messages[0].text == "go"
    texts = [
        {cid: r.text for cid, r in m.tool_results.items()}
        for m in repaired.messages
        if m.tool_results
    ]
    assert texts == [
        {"call-k1": "k1 counted"},
        {"call-k2": "k2 counted"},
        {"call-gate": INTERRUPTED_TEXT},
    ]
    assert repaired.iterations == 2 and ran == {"k1": 1, "k2": 1}
    statuses = await listed(client, turn.workflow_id, len(runs))
    assert len(runs) == 6
    assert statuses == [WorkflowExecutionStatus.CONTINUED_AS_NEW] * 5 + [
        WorkflowExecutionStatus.CANCELED
    ]


# -- a worker killed around a cut -------------------------------------------------------------


async def test_worker_killed_in_a_continued_run_is_replaced_and_the_turn_finishes(
    client: Client, temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    """One step per run. The second model call (in the third run, just started from a cut)
    hangs until its worker is SIGKILLed; a new worker replays that run from the state it was
    handed, and the retried call reads its input from it by query: the same run id, a
    different worker."""
    answers = [
        Reply.tool_calls(("c1", TOOL, effect("a")["arguments"])),
        Reply.tool_calls(
            ("c2", TOOL, effect("b")["arguments"]), ("c3", TOOL, effect("c")["arguments"])
        ),
        Reply.text("all done"),
    ]
    record = tmp_path / "record.jsonl"
    task_queue = f"continued-{uuid.uuid4().hex[:10]}"
    agent = {
        "model": "anthropic.test-model",
        "servers": ["effects"],
        "llm_timeouts": FAST_RECOVERY,
        "tool_timeouts": FAST_RECOVERY,
    }
    config = {
        "task_queue": task_queue,
        "mcp": {"servers": {"effects": effects_server(record)}},
        "agents": {"fake": agent},
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "continue_as_new": EVERY_STEP,
    }
    path = write_config(tmp_path / "turnkeep.yaml", config)

    async def start() -> TurnHandle:
        turn = TurnInput(agent="fake", messages=["go"])
        return await start_turn(client, turn, task_queue=task_queue)

    with WorkerProcesses(path, temporal.address, tmp_path / "logs") as workers:
        first = await workers.start_polling(client, task_queue)
        fake.script(*answers, api="anthropic")
        baseline = await asyncio.wait_for((await start()).result(), 120)

        fake.reset()
        fake.script(answers[0], Reply.delay(300, then=answers[1]), *answers[1:], api="anthropic")
        turn = await start()
        await eventually(lambda: len(fake.requests) == 2, "the second model call is in flight")
        in_flight = (await turn.handle.describe()).run_id
        workers.kill(first)
        await workers.start_polling(client, task_queue)
        try:
            result = await asyncio.wait_for(turn.result(), 120)
        except TimeoutError:
            raise AssertionError(f"the turn did not finish:\n{workers.log_tail()}") from None
    runs = await chain(client, turn.workflow_id)

    assert result.stop_reason == StopReason.END_TURN
    assert stable(result.messages) == stable(baseline.messages)
    assert len(fake.requests) == 4  # the interrupted model call was made again
    # No tool was in flight at the kill: each ran exactly once, whichever run it fell in.
    assert_ran(record, turn.workflow_id, {"c1", "c2", "c3"}, once={"c1", "c2", "c3"})
    # The call was in flight in the third run, which started from a cut; its second attempt
    # completed there and the run went on to continue as new.
    assert [r.run_id for r in runs].index(in_flight) == 2
    killed = runs[2]
    assert killed.activities() == ["llm_step"]
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in killed.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert attempts == [2]
    assert killed.ended == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    assert len(runs) == 5  # llm, tool, llm (killed), tools, llm


# -- the CLI -------------------------------------------------------------------------------


async def test_cli_run_streams_a_continued_turn_and_show_shows_all_of_it(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    expressions = ["6 * 7", "2 + 2", "10 - 3"]
    script = write_script(
        tmp_path / "script.json",
        *(
            {
                "tool_calls": {
                    f"calc{i}": {"name": "toolbox__calculate", "arguments": {"expression": e}}
                }
            }
            for i, e in enumerate(expressions)
        ),
        "that is 42, 4 and 7",
    )
    (tmp_path / "turnkeep.yaml").write_text(
        f"task_queue: cli-continued-{uuid.uuid4().hex[:8]}\n"
        "continue_as_new:\n  history_events: 1\n"
        "mcp:\n  servers:\n    toolbox:\n"
        f"      command: {sys.executable}\n"
        f"      args: [{DEMO_TOOLS}]\n"
        "agents:\n  demo:\n    model: playback\n"
        f"    playback: {script}\n    servers: [toolbox]\n",
        encoding="utf-8",
    )
    workflow_id = f"cli-continued-{uuid.uuid4().hex[:8]}"
    args = ["run", "calculate", "--worker", "--id", workflow_id, "--json"]
    ran_cli = await asyncio.to_thread(turnkeep, *args, temporal=temporal, cwd=tmp_path)
    assert ran_cli.returncode == 0, ran_cli.stderr
    # Every call was streamed as it happened, over all seven runs, through to the answer (on
    # stderr: with --json, stdout holds the result alone).
    streamed = ran_cli.stderr
    for name in ("calc0", "calc1", "calc2", "that is 42, 4 and 7", "stop reason: endTurn"):
        assert name in streamed, (name, streamed)
    result = TurnResult.model_validate_json(ran_cli.stdout)
    assert [r.text for m in result.messages if m.tool_results for r in m.tool_results.values()] == [
        "42",
        "4",
        "7",
    ]

    runs = await chain(client, workflow_id)
    assert len(runs) == 7  # one step per run: three model calls, three tool rounds, the answer

    shown = await asyncio.to_thread(turnkeep, "show", workflow_id, temporal=temporal, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    for text in ("calculate", "6 * 7", "10 - 3", "that is 42, 4 and 7"):
        assert text in shown.stdout, (text, shown.stdout)
