"""Limits shared by a fleet (issue 48): the config, the plan, and on a real dev server the
limiter workflow with the fake model API — a limit held by two worker processes together, a
waiting turn that says why, one 429's retry-after holding another turn's call, a cancelled
waiter, a worker SIGKILLed while the limiter holds waiters, and clients that try to raise a
limit or skip the queue. Limits are scaled so that each test takes seconds; every test has
limits of its own (limit names are per namespace)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from tests.conftest import HarnessFactory, eventually, make_settings, turn_setup
from tests.test_visibility import current_details
from tests.worker_process import WorkerProcesses, write_config
from turnkeep.cli.commands.approvals import awaiting_turns
from turnkeep.client.history import read_turn
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.activity_io import PrepareTurnRequest
from turnkeep.contract.limits_io import (
    ASK_CAPACITY_SIGNAL,
    CAPACITY_GRANT_SIGNAL,
    LIMITER_WORKFLOW_NAME,
    CapacityGrant,
    CapacityRequest,
    CapacityWait,
    LimiterStart,
    limiter_id,
)
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import TurnInput, TurnOverrides
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.providers.registry import ModelCatalog
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.workflows.limits import limiter
from turnkeep.workflows.limits.sending import spawn

LLM = {"start_to_close": 30, "heartbeat": 2, "max_attempts": 4}


def name() -> str:
    """A fake model of this test's own, so that its limit (and limiter) is too."""
    return f"m{uuid.uuid4().hex[:10]}"


def config(fake: FakeModelApi, model: str, limit: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "limits": {f"anthropic.{model}": limit},
        "agents": {"test": {"model": f"anthropic.{model}", "llm_timeouts": LLM}},
        **top,
    }


async def limiter_status(client: Client, limit: str) -> str:
    """The limiter's state in a line ("" before it runs)."""
    try:
        handle = client.get_workflow_handle(limiter_id(limit))
        return await handle.query("status", result_type=str)
    except RPCError:
        return ""


async def waits_for_capacity(turn: TurnHandle) -> bool:
    return "waiting for capacity" in await current_details(turn)


# --- config and plan --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ({"openai": {}}, "at least one of requests_per_minute"),
        ({"openai": {"requests_per_minute": 0}}, "greater than 0"),
        ({"openai": {"rpm": 5}}, "Extra inputs are not permitted"),
        ({"a b": {"concurrency": 1}}, "is no model string or provider name"),
    ],
)
def test_bad_limits_are_refused_clearly(limits: dict[str, Any], said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        Settings.model_validate({"limits": limits})


def test_a_limit_that_names_nothing_stops_the_worker(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, limits={"nosuch.model": {"concurrency": 1}})
    with pytest.raises(ValueError, match="names no model or provider this worker knows"):
        ModelCatalog(settings)


def test_the_plan_names_the_most_specific_limit_of_each_model(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        limits={
            "anthropic": {"concurrency": 50},
            "anthropic.claude-haiku-4-5": {"requests_per_minute": 120, "tokens_per_minute": 40000},
        },
        agents={
            "a": {"model": ["anthropic.claude-haiku-4-5", "anthropic.other", "openai.gpt-4.1"]}
        },
    )
    plan = turn_setup(settings).plan(PrepareTurnRequest(agent="a", overrides=TurnOverrides()))
    assert plan.limits == {
        "anthropic.claude-haiku-4-5": "anthropic.claude-haiku-4-5",
        "anthropic.other": "anthropic",
    }
    # No limit, no entry: such a turn asks no limiter.
    bare = turn_setup(make_settings(tmp_path, agents={"a": {"model": "openai.gpt-4.1"}}))
    assert bare.plan(PrepareTurnRequest(agent="a", overrides=TurnOverrides())).limits == {}


# --- sends not waited for -----------------------------------------------------------------


def test_a_send_dropped_before_it_runs_leaves_no_coroutine_never_awaited() -> None:
    """A turn's settle (a limiter's grant) is sent by a task of its own. A run evicted from the
    worker's cache with such a task still queued drops it unrun, as a loop closed here does:
    Python must find no coroutine never awaited when it collects it. One cancelled first ends
    without running; one the loop runs sends."""
    sent: list[str] = []

    async def send(what: str) -> None:
        sent.append(what)

    def queued(loop: asyncio.AbstractEventLoop, what: str) -> asyncio.Task[None]:
        sending: set[asyncio.Task[None]] = set()
        asyncio._set_running_loop(loop)  # as the workflow's loop runs its code
        try:
            spawn(sending, functools.partial(send, what))
        finally:
            asyncio._set_running_loop(None)
        (task,) = sending
        return task

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dropped = asyncio.new_event_loop()
        queued(dropped, "dropped")
        dropped.close()
        del dropped
        gc.collect()
        loop = asyncio.new_event_loop()
        try:
            queued(loop, "cancelled").cancel()
            ran = queued(loop, "ran")
            loop.run_until_complete(ran)
        finally:
            loop.close()
        gc.collect()
    assert not [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert sent == ["ran"]


# --- on a dev server --------------------------------------------------------------------


async def test_a_waiting_turn_says_why_and_a_cancelled_one_withdraws(
    harness: HarnessFactory, fake: FakeModelApi, client: Client
) -> None:
    model = name()
    limit = f"anthropic.{model}"
    fake.script(
        Reply.delay(3.0, Reply.text("first")), Reply.text("third"), Reply.text("x"), model=model
    )
    async with harness(**config(fake, model, {"concurrency": 1})) as h:
        first = await h.start("one")
        await eventually(lambda: fake.requests_for_model(model), "the first call is in flight")
        second = await h.start("two")

        await eventually(lambda: waits_for_capacity(second), "the second turn waits for capacity")
        said = f"waiting for capacity: {limit} 1/1 concurrency"
        assert said in await current_details(second)
        assert "1 waiting" in await limiter_status(client, limit)
        # `turnkeep pending` and `turnkeep show` say so too.
        listed = {t.workflow_id: t for t in await awaiting_turns(client)}
        assert listed[second.workflow_id].waiting_for_capacity == said
        assert (await read_turn(client, second.workflow_id)).waiting_for_capacity == said

        await second.cancel()

        async def cancelled() -> bool:
            status = (await second.handle.describe()).status
            return status == WorkflowExecutionStatus.CANCELED

        await eventually(cancelled, "the waiting turn ends cancelled")

        async def withdrawn() -> bool:
            return "0 waiting" in await limiter_status(client, limit)

        await eventually(withdrawn, "the cancelled turn's request left the queue")
        assert (await first.result()).final.text == "first"  # type: ignore[union-attr]
        # The slot the cancelled turn never took is free for the next turn.
        third = await h.run("three")
        assert third.final is not None and third.final.text == "third"
        assert len(fake.requests_for_model(model)) == 2


async def test_a_burst_of_turns_all_get_through(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    """Thirty turns at once on a limit of four calls at a time: calls end (and free their
    slots) while the limiter is still sending grants, and every turn gets through."""
    model = name()
    fake.script(*(Reply.text(f"t{n}") for n in range(30)), model=model)
    async with harness(**config(fake, model, {"requests_per_minute": 1200, "concurrency": 4})) as h:
        turns = await asyncio.gather(*(h.start(f"n{n}") for n in range(30)))
        results = await asyncio.wait_for(asyncio.gather(*(t.result() for t in turns)), 90)
    assert all(r.stop_reason == StopReason.END_TURN for r in results)
    assert len(fake.requests_for_model(model)) == 30


async def test_one_429_holds_another_turns_call(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    model = name()
    fake.script(
        Reply.error(429, "slow down", headers={"retry-after": "2"}),
        Reply.text("a"),
        Reply.text("b"),
        model=model,
    )
    async with harness(**config(fake, model, {"requests_per_minute": 600})) as h:
        first = await h.start("one")

        async def backing_off() -> bool:
            return "backing off until" in await limiter_status(h.client, f"anthropic.{model}")

        await eventually(backing_off, "the limiter holds its calls")
        second = await h.start("two")

        # The other turn shows it (unless the backoff ended before it asked).
        with contextlib.suppress(AssertionError):
            await eventually(lambda: waits_for_capacity(second), "the other turn waits", within=1.0)
        results = await asyncio.gather(first.result(), second.result())
    assert {r.final.text for r in results if r.final} == {"a", "b"}
    assert all(r.stop_reason == StopReason.END_TURN for r in results)
    times = [r.at for r in fake.requests_for_model(model)]
    assert len(times) == 3
    # Neither the retry nor the other turn's call went before the retry-after was over.
    assert min(times[1:]) - times[0] >= 1.8


async def test_clients_cannot_raise_a_limit_or_skip_the_queue(
    harness: HarnessFactory, fake: FakeModelApi, client: Client
) -> None:
    model = name()
    limit = f"anthropic.{model}"
    fake.script(Reply.delay(2.0, Reply.text("first")), Reply.text("second"), model=model)
    async with harness(**config(fake, model, {"concurrency": 1})) as h:
        # Started by hand, with a ledger of its own: the values still come from the config,
        # and a state is taken only from a run that continued as new.
        forged = LimiterStart(ledger={"leases": {}, "window": [], "backoff_until": None})
        await client.start_workflow(
            LIMITER_WORKFLOW_NAME, forged, id=limiter_id(limit), task_queue=h.task_queue
        )
        first = await h.start("one")
        await eventually(lambda: fake.requests_for_model(model), "the first call is in flight")
        second = await h.start("two")

        await eventually(lambda: waits_for_capacity(second), "the second turn waits")
        # A grant that answers no request of the turn is ignored; the turn still waits.
        wrong = CapacityGrant(limit=limit, request_id="c99")
        await second.handle.signal(CAPACITY_GRANT_SIGNAL, wrong)
        other_limit = CapacityGrant(limit="anthropic", request_id="c1")
        await second.handle.signal(CAPACITY_GRANT_SIGNAL, other_limit)
        await asyncio.sleep(0.5)
        assert len(fake.requests_for_model(model)) == 1
        # The limiter ignores a request for another limit than its own, and a malformed one.
        request = CapacityRequest(limit="openai", request_id="x1", workflow_id="w", run_id="r")
        limiter = client.get_workflow_handle(limiter_id(limit))
        await limiter.signal(ASK_CAPACITY_SIGNAL, request)
        await limiter.signal(ASK_CAPACITY_SIGNAL, {"limit": limit, "request_id": "no spaces!"})
        waiting = await limiter.query("waiting", result_type=list[CapacityWait])
        assert not any(w.workflow_id == "w" for w in waiting)
        assert "0/1 concurrency" not in await limiter_status(client, limit)
        await asyncio.gather(first.result(), second.result())
        # A limiter of a limit no worker's config has fails at once.
        stray = await client.start_workflow(
            LIMITER_WORKFLOW_NAME, LimiterStart(), id=limiter_id(name()), task_queue=h.task_queue
        )
        with pytest.raises(Exception, match="failed"):
            await stray.result()


# --- two worker processes ----------------------------------------------------------------


async def test_two_worker_processes_hold_one_limit_and_survive_a_sigkill(
    client: Client, temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    """Four turns on two worker processes, one call at a time between them (concurrency 1):
    no two calls overlap at the provider. One worker is SIGKILLed while the limiter holds
    waiters; a new one carries on, and every turn ends."""
    model = name()
    limit = f"anthropic.{model}"
    hold = 0.6
    # Two spare answers: a call the SIGKILL cut off is made again.
    fake.script(*(Reply.delay(hold, Reply.text(f"t{n}")) for n in range(6)), model=model)
    task_queue = f"limits-{uuid.uuid4().hex[:8]}"
    path = write_config(
        tmp_path / "turnkeep.yaml",
        {"task_queue": task_queue, **config(fake, model, {"concurrency": 1})},
    )
    with WorkerProcesses(path, temporal.address, tmp_path / "logs") as workers:
        pids = [workers.start(), workers.start()]
        for pid in pids:
            await workers.wait_polling(client, task_queue, pid)
        turns: list[TurnHandle] = [
            await start_turn(
                client, TurnInput(agent="test", messages=[f"go {n}"]), task_queue=task_queue
            )
            for n in range(4)
        ]

        async def held() -> bool:
            status = await limiter_status(client, limit)
            return "1/1 concurrency" in status and "0 waiting" not in status

        await eventually(held, "the limiter holds waiters")
        workers.kill(pids[0])
        await workers.start_polling(client, task_queue)
        try:
            results = await asyncio.wait_for(asyncio.gather(*(t.result() for t in turns)), 60)
        except TimeoutError:
            status = await limiter_status(client, limit)
            raise AssertionError(f"{status}\n{workers.log_tail(6000)}") from None
    texts = {r.final.text for r in results if r.final}
    assert len(texts) == 4 and texts <= {f"t{n}" for n in range(6)}
    calls = sorted(r.at for r in fake.requests_for_model(model))
    assert len(calls) >= 4
    # One at a time: each call began after the one before had its answer (give or take the
    # call a killed worker had in flight, which its turn repeats under the same grant).
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert sum(1 for gap in gaps if gap < hold * 0.9) <= 1


async def test_the_limiter_continues_as_new_with_its_ledger(
    harness: HarnessFactory, fake: FakeModelApi, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limiter, "CONTINUE_AFTER_EVENTS", 20)
    model = name()
    limit = f"anthropic.{model}"
    fake.script(*(Reply.text(f"t{n}") for n in range(5)), model=model)
    async with harness(**config(fake, model, {"requests_per_minute": 600})) as h:
        for n in range(5):
            assert (await h.run(f"go {n}")).final.text == f"t{n}"  # type: ignore[union-attr]

        async def carried() -> bool:
            return "5/600 rpm" in await limiter_status(client, limit)

        await eventually(carried, "the limiter's window holds every call")
    runs = [w.run_id async for w in client.list_workflows(f'WorkflowId = "{limiter_id(limit)}"')]
    assert len(runs) > 1


async def test_the_estimate_counts_the_instruction_and_the_tools(
    harness: HarnessFactory, fake: FakeModelApi, client: Client
) -> None:
    """The provider counts a request's system prompt and tool definitions: so does the
    estimate a grant holds until its call settles."""
    model = name()
    limit = f"anthropic.{model}"
    fake.script(Reply.delay(3.0, Reply.text("done")), model=model)
    options = config(fake, model, {"tokens_per_minute": 1_000_000})
    options["agents"]["test"].update(
        instruction="Be brief. " * 2000, max_tokens=10, servers=["notes"]
    )

    async def in_use() -> int:
        status = await limiter_status(client, limit)
        return (
            int(status.split(" tpm")[0].rsplit(" ", 1)[-1].split("/")[0]) if "tpm" in status else 0
        )

    async with harness({"notes": [take_note]}, **options) as h:
        turn = await h.start("hi")
        await eventually(lambda: fake.requests_for_model(model), "the call is in flight")
        await eventually(lambda: in_use(), "the limiter holds the call's estimate")
        # The instruction is 20,000 characters and the tool's description 8,000: 7,000 tokens
        # (the prompt and the output are a few).
        assert await in_use() >= 7000
        await turn.result()


def take_note(text: str) -> str:
    return text


take_note.__doc__ = "Takes a note. " * 572
