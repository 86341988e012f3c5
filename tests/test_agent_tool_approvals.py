"""Calls awaiting approval inside an agent's child turn reach the people watching the parent
turn, on the real dev server: the parent's status, its ``pending_approvals`` query and
``turnkeep pending`` show the child's call with the child's turn id; a decision sent to the
parent (the client's ``decide``, ``turnkeep approve PARENT CALL``) is taken by the child."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from tests.conftest import Harness, answered_at_the_terminal, eventually, make_settings, turnkeep
from tests.test_visibility import current_details
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.approval import CHILD_APPROVALS_SIGNAL, ChildApprovals, PendingCall
from turnkeep.contract.messages import StopReason
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing import check_replay
from turnkeep.testing import harness as worker_harness
from turnkeep.workflows import visibility
from turnkeep.workflows.agent_tools import child_id
from turnkeep.workflows.child_approvals import report_problem

pytestmark = pytest.mark.asyncio

deployed: list[str] = []


def deploy(service: str) -> str:
    """Deploys ``service``."""
    deployed.append(service)
    return f"deployed {service}"


TEAM: dict[str, Any] = {
    "pmo": {"model": "passthrough", "agents": ["ops", "lead"]},
    "lead": {"model": "passthrough", "agents": ["ops"]},
    "ops": {
        "model": "passthrough",
        "servers": ["local"],
        "approval": {"tools": ["local__deploy"], "timeout": "1d"},
    },
}
DEPLOY = '***CALL_TOOL local__deploy {"service": "api"}'


def ask(agent: str, message: str) -> str:
    """A prompt that makes the passthrough model call ``agent`` with ``message``."""
    return f"***CALL_TOOL agent__{agent} {json.dumps({'message': message})}"


@pytest.fixture
async def h(client: Client, tmp_path: Path) -> AsyncIterator[Harness]:
    deployed.clear()
    settings = make_settings(tmp_path, agents=TEAM)
    async with worker_harness(
        client, settings, function_tools={"local": [deploy]}, default_agent="pmo"
    ) as worker:
        yield worker


async def waiting(turn: TurnHandle) -> list[PendingCall]:
    return await eventually(turn.pending_approvals, "a call awaits approval")


async def status(turn: TurnHandle) -> str | None:
    described = await turn.handle.describe()
    return described.typed_search_attributes.get(visibility.STATUS)


async def test_a_childs_call_shows_on_the_parent_and_is_approved_through_it(h: Harness) -> None:
    turn = await h.start(ask("ops", DEPLOY))
    child = child_id(turn.workflow_id, 1, "call_1_1")
    [call] = await waiting(turn)
    # The child's own call id (the passthrough model numbers the parent's calls alike).
    assert (call.call_id, call.name, call.arguments) == (
        "call_1_1",
        "local__deploy",
        {"service": "api"},
    )
    assert (call.turn_id, call.agent) == (child, "ops")
    # The child lists it as its own.
    [own] = await get_turn(h.client, child).pending_approvals()
    assert (own.call_id, own.turn_id) == ("call_1_1", None)

    async def awaiting() -> bool:
        return await status(turn) == "AwaitingApproval"

    await eventually(awaiting, "the parent's status says AwaitingApproval")
    details = await current_details(turn)
    assert "waiting on approval (1 call)" in details
    assert f"agent **ops** in turn `{child}`" in details

    # Sent to the parent, the decision is taken by the child, whose tool then runs.
    record = await turn.decide("call_1_1", True, by="alice")
    assert (record.call_id, record.tool, record.by) == ("call_1_1", "local__deploy", "alice")
    result = await turn.result()
    assert deployed == ["api"]
    assert result.stop_reason == StopReason.END_TURN
    assert result.final is not None and result.final.text == "deployed api"
    [decision] = (await get_turn(h.client, child).result()).decisions
    assert decision.by == "alice"
    assert await status(turn) == "Completed"


async def test_the_prompt_following_the_parent_asks_about_the_childs_call(h: Harness) -> None:
    """What ``run``, ``watch`` and ``chat`` do: follow the parent's messages, and ask at the
    terminal (here, a typed ``y``) about each call waiting in it or below it."""
    turn = await h.start(ask("ops", DEPLOY))
    shown = await answered_at_the_terminal(turn, "y\n")
    child = child_id(turn.workflow_id, 1, "call_1_1")
    assert f"approval needed · local__deploy · call call_1_1 · agent ops (turn {child})" in shown
    assert "approved call call_1_1" in shown
    assert deployed == ["api"]
    [decision] = (await get_turn(h.client, child).result()).decisions
    assert decision.by == "dana"


async def test_a_grandchilds_call_reaches_the_top_turn(h: Harness) -> None:
    turn = await h.start(ask("lead", ask("ops", DEPLOY)))
    lead = child_id(turn.workflow_id, 1, "call_1_1")
    [call] = await waiting(turn)
    assert (call.turn_id, call.agent) == (child_id(lead, 1, "call_1_1"), "ops")
    await turn.decide("call_1_1", False, reason="not today", by="bob")
    result = await turn.result()
    assert deployed == []
    # The denial is the grandchild's tool result, which each turn above passes on.
    assert result.final is not None
    assert result.final.text == "Tool call denied by bob: not today"
    # The reports and their handling are deterministic: each of the three turns replays.
    ids = [turn.workflow_id, lead, call.turn_id]
    histories = [await h.client.get_workflow_handle(id).fetch_history() for id in ids]
    assert await check_replay(histories) == 3


async def test_cli_lists_a_childs_call_under_the_parent_and_denies_it(
    h: Harness, temporal: ServerInfo, tmp_path: Path
) -> None:
    turn = await h.start(ask("ops", DEPLOY))
    child = child_id(turn.workflow_id, 1, "call_1_1")
    await waiting(turn)

    # In a thread: the CLI's query and update are answered by this process's worker.
    async def listed() -> list[dict[str, Any]]:
        out = await asyncio.to_thread(
            turnkeep, "pending", "--json", temporal=temporal, cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr
        ids = {t["workflow_id"] for t in json.loads(out.stdout)}
        # Both say AwaitingApproval; the child's call is listed once, under the parent.
        assert child not in ids
        return [t for t in json.loads(out.stdout) if t["workflow_id"] == turn.workflow_id]

    [entry] = await eventually(listed, "pending lists the parent")
    assert [(c["call_id"], c["turn_id"], c["agent"]) for c in entry["calls"]] == [
        ("call_1_1", child, "ops")
    ]
    out = await asyncio.to_thread(
        turnkeep,
        "approve",
        turn.workflow_id,
        "call_1_1",
        "--deny",
        "--reason",
        "no",
        "--by",
        "carol",
        temporal=temporal,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "denied call call_1_1" in out.stdout
    result = await turn.result()
    assert deployed == []
    assert result.final is not None and result.final.text == "Tool call denied by carol: no"


async def test_a_parent_takes_reports_only_from_its_running_children_about_their_turns() -> None:
    """The ``child_approvals`` signal has no proof of its sender: what it may claim is bounded."""
    since = datetime.now(UTC)

    def report(turn_id: str, *owners: str | None) -> ChildApprovals:
        calls = [
            PendingCall(call_id="c", name="t", arguments={}, since=since, turn_id=o) for o in owners
        ]
        return ChildApprovals(turn_id=turn_id, calls=calls)

    children = {"p/1/a": "a"}
    assert report_problem(report("p/1/a", "p/1/a", "p/1/a/2/b"), children) is None
    assert report_problem(report("p/1/a"), children) is None
    assert report_problem(report("p/1/b", "p/1/b"), children) is not None  # not a child
    assert report_problem(report("p/1/a", "p/1/ab"), children) is not None  # not below it
    assert report_problem(report("p/1/a", None), children) is not None  # whose?


async def test_a_call_waiting_in_a_chains_step_shows_on_the_chain_and_is_approved_through_it(
    client: Client, tmp_path: Path
) -> None:
    """A workflow agent's steps are child turns too: a call waiting in one shows on the
    workflow agent's turn, and is decided through it."""
    deployed.clear()
    agents = {**TEAM, "ship": {"type": "chain", "sequence": ["ops"]}}
    settings = make_settings(tmp_path, agents=agents)
    async with worker_harness(
        client, settings, function_tools={"local": [deploy]}, default_agent="ship"
    ) as h:
        turn = await h.start(DEPLOY)
        [call] = await waiting(turn)
        assert (call.call_id, call.agent) == ("call_1_1", "ops")
        assert call.turn_id is not None and call.turn_id.startswith(turn.workflow_id + "/")

        async def awaiting() -> bool:
            return await status(turn) == "AwaitingApproval"

        await eventually(awaiting, "the chain's status says AwaitingApproval")
        await turn.decide("call_1_1", True, by="alice")
        result = await turn.result()
    assert deployed == ["api"]
    assert result.final is not None and result.final.text == "deployed api"


async def test_a_client_forging_child_reports_changes_nothing_the_turn_waits_for(
    h: Harness,
) -> None:
    """Any client may signal a turn: a report that is not a running child's, about a turn not
    below it, or not a report at all, is ignored, and the turn goes on as it was."""
    turn = await h.start(ask("ops", DEPLOY))
    child = child_id(turn.workflow_id, 1, "call_1_1")
    [real] = await waiting(turn)
    forged = PendingCall(
        call_id="call_9_9", name="local__deploy", arguments={}, since=datetime.now(UTC)
    )
    for signal_args in (
        [
            ChildApprovals(
                turn_id="someone-else", calls=[forged.model_copy(update={"turn_id": "x"})]
            )
        ],
        [ChildApprovals(turn_id=child, calls=[forged.model_copy(update={"turn_id": "elsewhere"})])],
        [{"turn_id": child, "calls": "not a list"}],
        [],
    ):
        await turn.handle.signal(CHILD_APPROVALS_SIGNAL, args=signal_args)
    # Signals are taken in order: once a later query answers, all four have been handled.
    assert await turn.pending_approvals() == [real]
    await turn.decide("call_1_1", True, by="alice")
    result = await turn.result()
    assert result.final is not None and result.final.text == "deployed api"


async def test_a_client_cannot_start_a_turn_deeper_than_the_workers_limit(h: Harness) -> None:
    """``TurnInput.depth`` is the client's to set: it can only bring the limit nearer."""
    turn = await h.start("hello", agent="ops", depth=6)
    with pytest.raises(WorkflowFailureError) as failed:
        await turn.result()
    # The turn failed in prepare_turn, with the worker's refusal as the activity's cause.
    refusal = failed.value.cause.cause if failed.value.cause else None
    assert isinstance(refusal, ApplicationError) and refusal.type == "AgentDepthExceeded"
    assert "max_agent_depth (5)" in refusal.message


async def test_pending_names_each_childs_call_by_its_turn_and_its_command_decides_it(
    h: Harness, temporal: ServerInfo, tmp_path: Path
) -> None:
    """Two children of one turn each number their call `call_1_1`: `pending` lists each in its
    child turn, with a command naming that turn, and each command decides its own call."""
    turn = await h.start(f"{ask('ops', DEPLOY)}\n{ask('ops', DEPLOY)}")
    children = [child_id(turn.workflow_id, 1, call) for call in ("call_1_1", "call_1_2")]

    async def both_listed() -> str | None:
        out = await asyncio.to_thread(turnkeep, "pending", temporal=temporal, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        return out.stdout if out.stdout.count("call call_1_1 (local__deploy)") == 2 else None

    listed = await eventually(both_listed, "pending lists both children's calls")
    # Under the parent, once; each call qualified by the child turn it waits in.
    assert listed.count(f"turn {turn.workflow_id} · agent pmo") == 1
    for child in children:
        assert f"\nturn {child} " not in listed  # no heading of its own
        assert (
            f"waiting for approval · call call_1_1 (local__deploy) in child turn {child} "
            "(agent ops) · since "
        ) in listed
    commands = re.findall(r"decide with: (.+)", listed)
    mine = [c for c in commands if turn.workflow_id in c]
    assert sorted(mine) == sorted(f"turnkeep approve {c} call_1_1 [--deny]" for c in children)
    # Each command, as printed (without the optional --deny), decides its own child's call.
    for command in mine:
        argv = shlex.split(command.removesuffix(" [--deny]"))[1:]
        done = await asyncio.to_thread(
            turnkeep, *argv, "--by", "erin", temporal=temporal, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        assert "approved call call_1_1 (local__deploy)" in done.stdout
    await turn.result()
    assert deployed == ["api", "api"]
    for child in children:
        [decision] = (await get_turn(h.client, child).result()).decisions
        assert (decision.call_id, decision.by) == ("call_1_1", "erin")
