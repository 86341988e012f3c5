"""Always allow: a decision remembered for the rest of the turn or of the session (optionally
only with the same arguments) lets the later calls it covers run without waiting, each recorded
as approved by ``rule:<who set it>``; it never passes a policy's denial; a session carries its
rules across turns and continue-as-new; a revoked rule makes calls wait again; a turn takes
rules only from its session. Loop control without a server, then the real dev server."""

from __future__ import annotations

import asyncio
import functools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.service import RPCError

from tests.conftest import answered_at_the_terminal, eventually, turnkeep
from tests.test_loop import plan
from turnkeep.client.turns import get_turn
from turnkeep.config.agents import Agent
from turnkeep.contract.activity_io import ToolCallRequest, ToolSpec
from turnkeep.contract.approval import (
    AllowRule,
    ApprovalPlan,
    Decision,
    PolicyDecision,
    PolicyVerdicts,
)
from turnkeep.contract.messages import Message, StopReason, ToolCall
from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing.environment import harness
from turnkeep.testing.fake_api import Reply
from turnkeep.testing.fake_model import FakeModel
from turnkeep.workflows import pending_calls
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.tool_batch import apply_rules, apply_verdicts
from turnkeep.workflows.waits import approval, kinds

pytestmark = pytest.mark.asyncio

NOW = datetime(2026, 1, 1, tzinfo=UTC)
written: list[str] = []


def write(text: str) -> str:
    """Writes ``text``."""
    written.append(text)
    return f"wrote {text}"


@pytest.fixture(autouse=True)
def fresh() -> None:
    written.clear()


# -- loop control (no server) --------------------------------------------------------------------


def _state(*calls: tuple[str, dict[str, Any]], in_session: bool = False) -> TurnState:
    rules = ApprovalPlan(tools=["fs__*"], timeout=60)
    turn = TurnInput(agent="test", messages=["hi"])
    state = TurnState.start(turn, plan(max_iterations=5, approval=rules), in_session=in_session)
    state.tools = [ToolSpec(name="fs__write")]
    state.on_assistant(
        Message(
            role="assistant",
            tool_calls={
                f"w{i}": ToolCall(name="fs__write", arguments=args)
                for i, (_, args) in enumerate(calls, 1)
            },
            stop_reason=StopReason.TOOL_USE,
        )
    )
    for call in state.tool_batch().gated:
        approval.hold(state, call, NOW)
    return state


def _decision(call: str, **fields: Any) -> Decision:
    return Decision(call_id=call, decision=fields.pop("decision", "approve"), by="alice", **fields)


async def test_a_remembered_decision_sets_a_rule_that_allows_the_calls_it_covers() -> None:
    state = _state(("w", {"text": "a"}), ("w", {"text": "a"}), ("w", {"text": "b"}))
    record = kinds.decide(
        state, _decision("w1", remember="turn", remember_arguments=True), NOW, "r1"
    )
    assert (record.rule, record.remember) == ("r1", "turn")
    [rule] = state.allow_rules
    assert (rule.tool, rule.arguments, rule.by, rule.scope) == (
        "fs__write",
        {"text": "a"},
        "alice",
        "turn",
    )
    # The batch's other call with the same arguments is allowed at once; the other still waits.
    assert list(state.pending_approvals) == ["w3"]
    assert [(d.call_id, d.by, d.rule) for d in state.decisions] == [
        ("w1", "alice", "r1"),
        ("w2", "rule:alice", "r1"),
    ]


async def test_what_a_remembered_decision_may_not_be() -> None:
    state = _state(("w", {"text": "a"}))
    problem = functools.partial(kinds.decision_problem, state)
    denied = _decision("w1", decision="deny", remember="turn")
    assert "only with an approval" in (problem(denied) or "")
    assert "goes only with remember" in (problem(_decision("w1", remember_arguments=True)) or "")
    assert "no session's" in (problem(_decision("w1", remember="session")) or "")
    assert (
        kinds.decision_problem(
            _state(("w", {}), in_session=True), _decision("w1", remember="session")
        )
        is None
    )


async def test_rules_apply_after_the_policy_and_can_be_revoked() -> None:
    state = _state(("w", {"text": "a"}), ("w", {"text": "b"}))
    batch = state.tool_batch()
    rule = AllowRule(id="r1", tool="fs__write", scope="turn", by="bob", at=NOW, call_id="x")
    # The policy denies w2: the rule, applied after it, allows only what would have waited.
    plan = ApprovalPlan(tools=["fs__*"], timeout=60, policy="guard")
    verdicts = PolicyVerdicts(decisions={"w2": PolicyDecision(action="deny", reason="no")})
    screened, _ = apply_verdicts(batch, plan, verdicts, ["w1", "w2"], NOW)
    allowed, records = apply_rules(screened, [rule], ["w1", "w2"], NOW)
    assert [c.call_id for c in allowed.to_run] == ["w1"] and not allowed.gated
    assert "w2" in allowed.answered and [(r.by, r.rule) for r in records] == [("rule:bob", "r1")]
    state.allow_rules.append(rule)
    assert (
        pending_calls.revoke_rule_problem(state, "r2")
        == "no rule 'r2' in this turn (active rules: r1)"
    )
    assert pending_calls.revoke(state, "r1", "carol", NOW) is not None
    assert "already revoked, by carol" in (pending_calls.revoke_rule_problem(state, "r1") or "")
    call = ToolCallRequest(agent="a", call_id="w9", name="fs__write", arguments={})
    assert apply_rules(batch.model_copy(update={"gated": [call]}), state.allow_rules, [], NOW)[
        0
    ].gated == [call]


# -- on a real server ----------------------------------------------------------------------------


def _agent(fake: FakeModel) -> Agent:
    return Agent(
        name="app",
        model=fake.model("app"),
        tools=[write],
        approval={"tools": ["app__write"], "timeout": "1h"},
    )


def _asks(call: str, text: str) -> Reply:
    return Reply.tool_calls((call, "app__write", {"text": text}))


async def _waits(turn: Any, call: str) -> bool:
    return [c.call_id for c in await turn.pending_approvals()] == [call]


async def test_always_in_a_turn_with_the_same_arguments(
    client: Client, fake_model: FakeModel, temporal: ServerInfo, tmp_path: Path
) -> None:
    fake_model.script(
        "app", _asks("w1", "a"), _asks("w2", "a"), _asks("w3", "b"), Reply.text("Done.")
    )
    async with harness(client, agents=[_agent(fake_model)], fake=fake_model) as h:
        turn = await h.start("go", agent="app")
        await eventually(lambda: _waits(turn, "w1"), "w1 waits")
        # In a thread: this process's worker answers the CLI's update.
        out = await asyncio.to_thread(
            turnkeep, "approve", turn.workflow_id, "w1", "--always", "turn", "--same-arguments",
            "--by", "alice", temporal=temporal, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "is allowed for the rest of the turn" in out.stdout
        # w2 (same arguments) ran without waiting; w3 (other arguments) waits.
        await eventually(lambda: _waits(turn, "w3"), "w3 waits")
        await turn.decide("w3", True, by="bob")
        result = await turn.result()
    assert written == ["a", "a", "b"]
    [rule] = result.allow_rules
    assert (rule.scope, rule.arguments, rule.by) == ("turn", {"text": "a"}, "alice")
    assert [(d.call_id, d.by, d.rule) for d in result.decisions] == [
        ("w1", "alice", rule.id),
        ("w2", "rule:alice", rule.id),
        ("w3", "bob", None),
    ]


async def test_a_session_carries_its_rules_across_turns_and_continue_as_new_until_revoked(
    client: Client, fake_model: FakeModel, temporal: ServerInfo, tmp_path: Path
) -> None:
    fake_model.script(
        "app",
        _asks("w1", "one"),
        Reply.text("1"),
        _asks("w2", "two"),
        Reply.text("2"),
        _asks("w3", "three"),
        Reply.text("3"),
    )
    async with harness(client, agents=[_agent(fake_model)], fake=fake_model) as h:
        # A run per turn: every later turn starts in a run continued as new.
        session = await h.session(agent="app", turns_per_run=1)
        sent = await session.send("first")
        turn = get_turn(h.client, sent.turn_id)
        await eventually(lambda: _waits(turn, "w1"), "w1 waits")
        record = await turn.decide("w1", True, by="alice", remember="session")
        assert record.rule is not None
        # Listed by the session while its turn runs, then once the turn has ended.
        assert [r.id for r in await session.allow_rules()] == [record.rule]
        await get_turn(h.client, sent.turn_id).result()
        second = await session.send("second")
        # Sent while the session continues as new, the turn starts in the next run.
        done = await eventually(lambda: _ended(h.client, second.turn_id), "turn 2 ended")
        assert [(d.call_id, d.by) for d in done.decisions] == [("w2", "rule:alice")]
        assert [r.id for r in await session.allow_rules()] == [record.rule]
        out = await asyncio.to_thread(
            turnkeep, "revoke", session.session_id, record.rule, "--by", "carol",
            temporal=temporal, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0 and "revoked rule" in out.stdout, out.stderr
        [revoked] = await session.allow_rules(include_revoked=True)
        assert revoked.revoked_by == "carol"
        with pytest.raises(WorkflowUpdateFailedError) as again:
            await session.revoke_allow(record.rule, by="carol")
        assert "already revoked" in str(again.value.cause)
        third = await session.send("third")
        turn3 = get_turn(h.client, third.turn_id)
        await eventually(lambda: _waits(turn3, "w3"), "w3 waits again")
        await turn3.decide("w3", False, by="dave")
        await turn3.result()
        assert await session.allow_rules() == []
        await session.close()
    assert written == ["one", "two"]


async def test_a_turn_takes_rules_only_from_its_session(
    client: Client, fake_model: FakeModel
) -> None:
    rule = AllowRule(id="r", tool="app__write", scope="session", by="me", at=NOW, call_id="x")
    async with harness(client, agents=[_agent(fake_model)], fake=fake_model) as h:
        turn = await h.start("go", agent="app", allow_rules=[rule])
        with pytest.raises(WorkflowFailureError) as failed:
            await turn.result()
    assert "only by its session" in str(failed.value.cause)
    assert written == []


async def test_the_terminal_prompt_offers_always(client: Client, fake_model: FakeModel) -> None:
    fake_model.script(
        "app", _asks("w1", "a"), _asks("w2", "a"), _asks("w3", "b"), Reply.text("Done.")
    )
    async with harness(client, agents=[_agent(fake_model)], fake=fake_model) as h:
        turn = await h.start("go", agent="app")
        # Always (for the turn, run's only choice), only with these arguments; then no.
        shown = await answered_at_the_terminal(turn, "a\ny\nn\n\n")
        result = await turn.result()
    assert "app__write is allowed for the rest of the turn" in shown
    assert shown.count("approval needed") == 2  # w1 and w3; w2 ran by the rule
    assert written == ["a", "a"]
    assert [(d.call_id, d.by) for d in result.decisions] == [
        ("w1", "dana"),
        ("w2", "rule:dana"),
        ("w3", "dana"),
    ]


async def _ended(client: Client, turn_id: str) -> TurnResult | None:
    """The turn's result, or None while it has not started."""
    try:
        return await get_turn(client, turn_id).result()
    except RPCError:
        return None
