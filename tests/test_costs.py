"""Cost, budgets and model fallback: prices and the cost of usage (pure), the budget's rules in
the loop (pure), and on the real dev server with the fake model API: a turn's cost in its
result and search attribute, budgets that ask (raised, refused past the ceiling, stopped),
`on_exceeded: stop`, a session's budget across turns, and a fallback model answering after
the primary's final error and after its 429s past the chain's attempts."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import genai_prices
import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError as ConfigError
from temporalio.service import RPCError

from tests.conftest import HarnessFactory, eventually, make_settings, turn_setup, turnkeep
from tests.test_approval_durability import still_waiting
from tests.test_chat_terminal import environment
from tests.test_durability import Fleet, worker_config
from tests.test_loop import plan
from tests.worker_process import WorkerProcesses
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.activity_io import BudgetPlan, PrepareTurnRequest, TurnPlan
from turnkeep.contract.approval import Decision
from turnkeep.contract.messages import Message, StopReason, json_channel
from turnkeep.contract.turn_io import (
    WORKFLOW_NAME,
    BudgetLimit,
    Spent,
    TurnInput,
    TurnOverrides,
    Usage,
)
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.providers.prices import ModelPrice, builtin_price
from turnkeep.providers.registry import ModelCatalog
from turnkeep.testing.fake_api import FakeModelApi, Reply, Tokens
from turnkeep.workflows import visibility
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits import budget_raise, kinds

pytestmark = pytest.mark.asyncio

NOW = datetime(2025, 1, 1, tzinfo=UTC)
# USD per million tokens: 10 input and 5 output tokens cost 0.00003 + 0.0001.
PRICE = {"input": 3.0, "output": 20.0}


def done(text: str) -> str:
    """Says it is done."""
    return f"done: {text}"


TOOLS = {"work": [done]}

# -- cost (pure) ---------------------------------------------------------------------------


async def test_costs_add_up_and_an_unknown_part_stays_unknown() -> None:
    price = ModelPrice(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
    usage = Usage(
        input_tokens=1000, output_tokens=100, cache_read_tokens=2000, cache_write_tokens=0
    )
    assert price.cost(usage) == pytest.approx((3000 + 1500 + 600) / 1e6)
    known = Usage(input_tokens=1, calls=1, cost_usd=0.5)
    unknown = Usage(input_tokens=1, calls=1)
    assert (known + known).cost_usd == 1.0
    assert (known + unknown).cost_usd is None and (unknown + known).cost_usd is None
    # Nothing spent is no unknown part: the empty usage a total starts from.
    assert (Usage() + known).cost_usd == 0.5
    assert builtin_price("anthropic", "claude-haiku-4-5") is not None
    assert builtin_price("anthropic", "claude-nonesuch") is None


async def test_list_prices_are_genai_prices_read_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object) -> None:
        raise OSError("no network for prices")

    monkeypatch.setattr(socket.socket, "connect", offline)
    haiku = builtin_price("anthropic", "claude-haiku-4-5")
    assert haiku is not None
    listed = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=1), "claude-haiku-4-5", provider_id="anthropic"
    ).model_price
    # turnkeep's input tokens leave the cache's out; genai-prices' count them in.
    usage = Usage(
        input_tokens=1000, output_tokens=100, cache_read_tokens=2000, cache_write_tokens=400
    )
    dollars = (
        1000 * listed.input_mtok
        + 100 * listed.output_mtok
        + 2000 * listed.cache_read_mtok
        + 400 * listed.cache_write_mtok
    )
    assert haiku.cost(usage) == pytest.approx(float(dollars) / 1e6)
    assert haiku.input_per_token == pytest.approx(float(listed.input_mtok) / 1e6)
    # Sonnet 4.5 costs more a token past 200k input tokens; an estimate is at the lower price.
    sonnet = builtin_price("anthropic", "claude-sonnet-4-5")
    assert sonnet is not None
    small, large = Usage(input_tokens=100_000), Usage(input_tokens=300_000)
    assert sonnet.cost(large) > 3 * sonnet.cost(small)
    assert sonnet.input_per_token == pytest.approx(sonnet.cost(small) / 100_000)
    # The other providers whose model ids are their own are priced too; a deployment or a
    # generic server's model is not, whatever its name.
    assert builtin_price("xai", "grok-4") is not None
    assert builtin_price("openrouter", "anthropic/claude-sonnet-4") is not None
    assert builtin_price("azure", "gpt-4o") is None
    assert builtin_price("generic", "gpt-4o") is None


async def test_the_config_prices_a_model_over_the_table_and_unknown_models_cost_unknown(
    tmp_path: Path,
) -> None:
    models = ModelCatalog(
        make_settings(tmp_path, prices={"haiku": {"input": 9, "output": 9}, "generic.x": PRICE})
    )
    haiku = models.price(models.resolve("anthropic.claude-haiku-4-5"))
    assert haiku is not None and haiku.input == 9 and haiku.cache_read is None
    assert models.price(models.resolve("generic.x")) == ModelPrice(3.0, 20.0)
    assert models.price(models.resolve("generic.y")) is None
    assert models.price(models.resolve("passthrough")) == ModelPrice(0, 0, 0, 0)


# -- budgets (pure) ------------------------------------------------------------------------


def state(budget: BudgetPlan, spent: Spent | None = None) -> TurnState:
    turn = TurnInput(agent="test", messages=["hi"], session_spent=spent)
    return TurnState.start(turn, plan(max_iterations=10, has_tools=False, budget=budget))


def answer(input_tokens: int, output_tokens: int, cost: float | None = None) -> Message:
    usage: dict[str, Any] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if cost is not None:
        usage["cost_usd"] = cost
    return Message(
        role="assistant", stop_reason=StopReason.TOOL_USE, channels={"usage": json_channel(usage)}
    )


async def test_a_budget_is_passed_by_what_is_spent_or_by_the_next_calls_estimated_input() -> None:
    s = state(BudgetPlan(unit="tokens", limit=100, max_raise=500))
    assert budget_raise.exceeded(s, estimated_input_tokens=50) is None
    # The estimate rule: 60 spent + about 50 more is over 100.
    s.on_assistant(answer(50, 10))
    assert budget_raise.exceeded(s, 50) == (
        "spent 60 tokens of 100 tokens; the next model call's input, about 50 tokens, would pass it"
    )
    # The spent rule.
    s.on_assistant(answer(40, 10))
    assert budget_raise.exceeded(s, 0) == "spent 110 tokens of 100 tokens"
    # A dollar budget counts the cost, and its estimate is at the plan's input price.
    usd = state(BudgetPlan(unit="usd", limit=1.0, input_usd_per_token=0.001))
    usd.on_assistant(answer(10, 10, cost=0.5))
    assert budget_raise.exceeded(usd, 400) is None
    assert budget_raise.exceeded(usd, 600) is not None
    # A session's budget counts its earlier turns.
    assert state(BudgetPlan(unit="tokens", limit=100, per="session"), Spent(tokens=100))
    session = state(BudgetPlan(unit="tokens", limit=100, per="session"), Spent(tokens=100))
    assert budget_raise.exceeded(session, 0) == "spent 100 tokens of 100 tokens"


async def test_budget_decisions_are_checked_and_a_raise_lets_the_call_through() -> None:
    s = state(BudgetPlan(unit="tokens", limit=100, max_raise=500))
    s.on_assistant(answer(100, 20))
    problem = budget_raise.exceeded(s, 0)
    assert problem is not None
    call = budget_raise.hold(s, problem, NOW)
    assert (call.call_id, call.kind, call.prompt) == ("budget:2", "budget", problem)

    def refused(**decision: Any) -> str | None:
        return kinds.decision_problem(s, Decision(call_id="budget:2", by="bo", **decision))

    assert (
        refused(decision="approve") == "raising the budget needs a limit: the new budget, in tokens"
    )
    assert "not above what is spent" in (refused(decision="approve", limit=120) or "")
    assert "above the most agent 'test' allows (500 tokens)" in (
        refused(decision="approve", limit=501) or ""
    )
    assert refused(decision="approve", limit=200, arguments={}) is not None
    assert refused(decision="deny") is None and refused(decision="approve", limit=500) is None
    record = kinds.decide(
        s, Decision(call_id="budget:2", decision="approve", by="bo", limit=300), NOW
    )
    assert (record.kind, record.arguments, record.original_arguments) == (
        "budget",
        {"limit": 300},
        {"limit": 100},
    )
    assert s.budget_limit == 300 and s.budget_raised == 200
    # The call a person let through goes ahead whatever its estimate.
    assert budget_raise.exceeded(s, 10_000) is None
    # A limit on a tool call's approval is refused.
    s.pending_approvals["t1"] = call.model_copy(update={"call_id": "t1", "kind": "approval"})
    no = Decision(call_id="t1", decision="approve", by="bo", limit=5)
    assert kinds.decision_problem(s, no) == "a limit goes only with a budget's wait"


async def test_a_stopped_budget_ends_the_turn_with_a_clean_final_message() -> None:
    s = state(BudgetPlan(unit="tokens", limit=10, on_exceeded="stop"))
    s.on_assistant(answer(10, 10).model_copy(update={"stop_reason": StopReason.END_TURN}))
    budget_raise.stop(s, budget_raise.exceeded(s, 0) or "")
    result = s.result()
    assert result.stop_reason == StopReason.PAUSE and s.done
    assert result.final is not None
    assert result.final.text == "Stopped at the budget: spent 20 tokens of 10 tokens."


async def test_a_turn_may_lower_its_budget_not_raise_it_and_usd_needs_prices(
    tmp_path: Path,
) -> None:
    agent = {"model": "generic.x", "budget": {"usd": 1.0}, "fallback_models": ["generic.y"]}
    generic = {"base_url": "http://127.0.0.1:9/v1"}
    setup = turn_setup(
        make_settings(tmp_path, generic=generic, prices={"generic.x": PRICE}, agents={"a": agent})
    )

    def plan(budget: BudgetLimit | None = None) -> TurnPlan:
        request = PrepareTurnRequest(agent="a", overrides=TurnOverrides(), budget=budget)
        return setup.plan(request)

    with pytest.raises(ConfigError, match=r"'generic\.y' has no price"):
        plan()
    priced = {"generic.x": PRICE, "generic.y": {"input": 6, "output": 1}}
    setup = turn_setup(make_settings(tmp_path, generic=generic, prices=priced, agents={"a": agent}))
    full = plan()
    assert full.budget is not None and full.budget.input_usd_per_token == pytest.approx(6e-6)
    assert full.fallback_models == ["generic.y"]
    lowered = plan(BudgetLimit(usd=0.5))
    assert lowered.budget is not None and lowered.budget.limit == 0.5
    with pytest.raises(ConfigError, match="a turn may lower it"):
        plan(BudgetLimit(usd=2.0))
    with pytest.raises(ConfigError, match="a turn may lower it"):
        plan(BudgetLimit(tokens=10))
    # `model: [primary, fallback]` is the chain.
    chain = make_settings(tmp_path, agents={"a": {"model": ["generic.x", "generic.y"]}})
    assert (chain.agents["a"].model, chain.agents["a"].fallback_models) == (
        "generic.x",
        ["generic.y"],
    )


# -- on the dev server ---------------------------------------------------------------------


def config(fake: FakeModelApi, **agent: Any) -> dict[str, Any]:
    llm = {"start_to_close": 30, "heartbeat": 5, "max_attempts": 3}
    return {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "prices": {"anthropic.primary": PRICE, "anthropic.backup": {"input": 1, "output": 1}},
        "agents": {
            "test": {
                "model": "anthropic.primary",
                "servers": ["work"],
                "llm_timeouts": llm,
                **agent,
            }
        },
    }


def tool_then_text(fake: FakeModelApi, model: str = "primary") -> None:
    fake.script(
        Reply.tool_calls(("c1", "work__done", {"text": "a"}), usage=Tokens(100, 10)),
        Reply.text("All done.", usage=Tokens(120, 5)),
        model=model,
    )


async def budget_wait(turn: TurnHandle) -> str:
    waiting = await eventually(turn.pending_approvals, "the turn waits at its budget")
    assert [c.kind for c in waiting] == ["budget"]
    return waiting[0].call_id


async def test_a_turns_cost_is_in_its_result_and_search_attribute(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    tool_then_text(fake)
    async with harness(TOOLS, **config(fake)) as h:
        turn = await h.start("go")
        result = await turn.result()
        usage = result.usage["anthropic.primary"]
        expected = (220 * 3.0 + 15 * 20.0) / 1e6
        assert usage.calls == 2 and usage.cost_usd == pytest.approx(expected)
        described = await turn.handle.describe()
        assert described.typed_search_attributes.get(visibility.COST_USD) == pytest.approx(expected)


async def test_a_budget_that_asks_refuses_a_raise_past_its_ceiling_then_is_raised(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    tool_then_text(fake)
    budget = {"tokens": 100, "max_raise": 1000}
    async with harness(TOOLS, **config(fake, budget=budget)) as h:
        turn = await h.start("go")
        call_id = await budget_wait(turn)
        assert call_id == "budget:2"
        await eventually(
            lambda: _status(turn, visibility.TurnStatus.AWAITING_APPROVAL), "status says waiting"
        )
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await turn.raise_budget(5000, by="alice")
        assert "above the most agent 'test' allows" in str(refused.value.cause)
        assert [c.call_id for c in await turn.pending_approvals()] == [call_id]  # still waiting
        record = await turn.raise_budget(500, by="alice")
        assert record.kind == "budget" and record.arguments == {"limit": 500}
        result = await turn.result()
        assert result.stop_reason == StopReason.END_TURN and result.budget_raised == 400
        assert [d.kind for d in result.decisions] == ["budget"]


async def test_a_budget_stopped_by_a_person_and_one_that_stops_by_itself(
    harness: HarnessFactory, fake: FakeModelApi, temporal: ServerInfo, tmp_path: Path
) -> None:
    tool_then_text(fake)

    def budget_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return turnkeep("budget", turn.workflow_id, *args, temporal=temporal, cwd=tmp_path)

    async with harness(TOOLS, **config(fake, budget={"tokens": 100})) as h:
        turn = await h.start("go")
        await budget_wait(turn)
        zero = await asyncio.to_thread(budget_cli, "--raise", "0")
        assert zero.returncode == 2 and "above 0" in zero.stderr, zero.stderr
        stop = await asyncio.to_thread(budget_cli, "--stop", "--by", "bob", "--reason", "enough")
        assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stderr
        result = await turn.result()
        # Once nothing waits at the budget: one line, a user's mistake (exit 2).
        late = await asyncio.to_thread(budget_cli, "--raise", "500")
        assert late.returncode == 2, late.stderr
        assert late.stderr.strip().splitlines() == [
            f"error: turn {turn.workflow_id!r} is not waiting at its budget"
        ]
        assert result.stop_reason == StopReason.PAUSE and result.final is not None
        assert result.final.text == (
            "Stopped at the budget: spent 110 tokens of 100 tokens (bob chose to stop: enough)."
        )
        assert fake.pending(model="primary") == 1  # the second call was never made
    fake.reset()
    tool_then_text(fake)
    async with harness(TOOLS, **config(fake, budget={"usd": 0.0003, "on_exceeded": "stop"})) as h:
        result = await h.run("go")
        assert result.stop_reason == StopReason.PAUSE and not result.decisions
        assert result.final is not None and "Stopped at the budget: spent" in result.final.text


async def test_a_session_budget_counts_across_its_turns(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    fake.script(
        Reply.text("one", usage=Tokens(100, 10)),
        Reply.text("two", usage=Tokens(100, 10)),
        model="primary",
    )
    budget = {"tokens": 250, "per": "session", "on_exceeded": "stop"}
    async with harness(TOOLS, **config(fake, budget=budget)) as h:
        session = await h.session()
        finals = []
        for text in ("a", "b", "c"):
            sent = await session.send(text)
            turn = get_turn(h.client, sent.turn_id)
            await eventually(lambda t=turn: _started(t), f"turn {sent.turn_id} started")
            finals.append((await turn.result()).stop_reason)
        # The third turn would pass the session's budget (220 spent by the first two, and its
        # input): it stops before any call.
        assert finals == [StopReason.END_TURN, StopReason.END_TURN, StopReason.PAUSE]
        assert len(fake.requests_for_model("primary")) == 2
        await session.close()
        # A client claiming its turn's session raised the budget by a fortune: refused before
        # any model call, as only a session hands a turn what it spent and raised.
        forged = await h.client.start_workflow(
            WORKFLOW_NAME,
            {"agent": "test", "messages": ["d"], "session_spent": {"raised": 1e9}},
            id=f"forged-{uuid.uuid4().hex[:8]}",
            task_queue=h.task_queue,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await forged.result()
        assert "only by its session" in str(failed.value.cause)
        assert len(fake.requests_for_model("primary")) == 2


async def test_a_fallback_model_answers_after_a_final_error_and_after_429s_past_its_attempts(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    fake.script(
        Reply.error(404, "no such model"),  # call 1: final at once
        Reply.error(429, "slow down"),  # call 2: rate limited, twice (fallback_after_attempts)
        Reply.error(429, "slow down"),
        model="primary",
    )
    tool_then_text(fake, model="backup")
    chain = ["anthropic.primary", "anthropic.backup"]
    async with harness(TOOLS, **config(fake, model=chain)) as h:
        result = await h.run("go")
        assert result.final is not None and result.final.text == "All done."
        assert list(result.usage) == ["anthropic.backup"]
        backup = result.usage["anthropic.backup"]
        assert backup.calls == 2 and backup.cost_usd == pytest.approx((220 + 15) / 1e6)
        assert fake.pending(model="primary") == 0


async def _started(turn: TurnHandle) -> bool:
    try:
        await turn.handle.describe()
    except RPCError:
        return False
    return True


async def _status(turn: TurnHandle, status: visibility.TurnStatus) -> bool:
    described = await turn.handle.describe()
    return described.typed_search_attributes.get(visibility.STATUS) == status.value


@pytest.mark.slow
async def test_worker_killed_while_a_turn_waits_at_its_budget(
    client: Client, temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    """A budget's wait is an approval's: a real worker process killed while the turn waits, a
    new one replays it to the same wait, and the raise lets the next model call through."""
    task_queue = f"budget-{uuid.uuid4().hex[:10]}"
    fake.script(
        Reply.tool_calls(("e1", "effects__effect", {"tag": "b1"}), usage=Tokens(100, 10)),
        Reply.text("done", usage=Tokens(120, 5)),
        api="anthropic",
    )
    agent = {
        "model": "anthropic.test-model",
        "servers": ["effects"],
        "budget": {"tokens": 150, "max_raise": 1000, "timeout": "1h"},
    }
    anthropic = {"api_key": "sk-test", "base_url": fake.base_url_anthropic}
    record = tmp_path / "record.jsonl"
    config = worker_config(tmp_path, task_queue, record, {"app": agent}, anthropic=anthropic)
    with WorkerProcesses(config, temporal.address, tmp_path / "logs") as workers:
        fleet = Fleet(client, workers, task_queue, record)
        first = await fleet.single()
        turn = await fleet.start("app")
        [pending] = await eventually(lambda: still_waiting(turn), "the turn waits at its budget")
        workers.kill(first)
        await workers.start_polling(client, task_queue)
        [again] = await eventually(lambda: still_waiting(turn), "it still waits")
        record_ = await turn.raise_budget(500, by="ops")
        result = await fleet.finish(turn)
    assert pending.kind == again.kind == "budget" and again.since == pending.since
    assert record_.kind == "budget" and record_.arguments == {"limit": 500}
    assert result.final is not None and result.final.text == "done"
    assert len(fake.requests_for("anthropic")) == 2  # no call repeated, none cut


# -- a budget's wait at the command line -----------------------------------------------------

CLI = (sys.executable, "-m", "turnkeep.cli")


def passthrough_budget(tmp_path: Path) -> None:
    """A turnkeep.yaml whose agent's budget (one token) holds its first model call."""
    config = {
        "task_queue": f"budget-cli-{uuid.uuid4().hex[:8]}",
        "agents": {"test": {"model": "passthrough", "budget": {"tokens": 1}}},
    }
    (tmp_path / "turnkeep.yaml").write_text(json.dumps(config), encoding="utf-8")


async def line_saying(proc: asyncio.subprocess.Process, text: str) -> str:
    """The first line ``proc`` prints with ``text`` in it."""
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        assert line, f"the command ended without a line saying {text!r}"
        if text in line:
            return line.rstrip("\n")


BUDGET_LINE = re.compile(
    r"^waiting for a budget decision: spent 0 tokens of 1 tokens; the next model call's input, "
    r"about \d+ tokens, would pass it · decide with: turnkeep budget (\S+) --raise N \| --stop$"
)


@pytest.mark.slow  # the command line in subprocesses, each with its worker
async def test_run_and_chat_without_a_terminal_say_a_budget_waits_and_how_to_decide_it(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    passthrough_budget(tmp_path)
    run = await asyncio.create_subprocess_exec(
        *CLI, "run", "hello there", "--worker",
        cwd=tmp_path, env=environment(temporal), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        said = BUDGET_LINE.match(await line_saying(run, "turnkeep budget"))
        assert said is not None
        turn_id = said.group(1)
        # `pending` says the same, in the same words, and names the same command.
        listed = await asyncio.to_thread(turnkeep, "pending", temporal=temporal, cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        mine = listed.stdout[listed.stdout.index(f"turn {turn_id}") :]
        assert mine.splitlines()[1].startswith(
            "  waiting for a budget decision · spent 0 tokens of 1 tokens; the next model call's"
        )
        assert mine.splitlines()[2] == (
            f"    decide with: turnkeep budget {turn_id} --raise N | --stop"
        )
        raised = await asyncio.to_thread(
            turnkeep, "budget", turn_id, "--raise", "100000", "--by", "ci",
            temporal=temporal, cwd=tmp_path,
        )  # fmt: skip
        assert raised.returncode == 0, raised.stderr
        out, err = await asyncio.wait_for(run.communicate(), 120)
    finally:
        if run.returncode is None:
            run.kill()
    assert run.returncode == 0, err.decode()
    assert "assistant › hello there" in out.decode()
    # The audit trail, for a person: what became of the budget, who raised it and when.
    assert "decision: raised the budget from 1 to 100,000 · by ci at " in out.decode()

    chat = await asyncio.create_subprocess_exec(
        *CLI, "chat", "--agent", "test", "--worker",
        cwd=tmp_path, env=environment(temporal), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert chat.stdin is not None
    chat.stdin.write(b"hello again\n")
    chat.stdin.close()
    try:
        said = BUDGET_LINE.match((await line_saying(chat, "turnkeep budget")).removeprefix("> "))
        assert said is not None and "/turn-1" in said.group(1)
        await get_turn(client, said.group(1)).raise_budget(100000, by="ci")
        out, err = await asyncio.wait_for(chat.communicate(), 120)
    finally:
        if chat.returncode is None:
            chat.kill()
    assert chat.returncode == 0, err.decode()
    assert "assistant › hello again" in out.decode()
