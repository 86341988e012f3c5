"""Approval policies, on the real dev server: a function registered on the worker decides on
each held tool call from its arguments (allow, deny with a reason the model sees, or ask a
person), in one `approval_policy` activity per batch; a policy that fails denies; a crafted
request for an agent without that policy is refused; an unknown policy stops the worker."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

from tests.conftest import Harness, eventually, make_settings, write_script
from tests.crafted_workflow import CraftedWorkflow
from tests.test_activity_checks import application_error
from turnkeep import Agent, Approval, ApprovalRequest, PolicyDecision, TurnHandle
from turnkeep.contract.approval import APPROVAL_POLICY
from turnkeep.contract.messages import CallToolResult
from turnkeep.contract.turn_io import TurnResult
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.fake_api import FakeModelApi, Reply

pytestmark = pytest.mark.asyncio

written: list[str] = []
seen: list[ApprovalRequest] = []  # every call a policy was asked about
attempts: list[str] = []  # every run of the failing policies


def write(text: str) -> str:
    """Writes ``text``."""
    written.append(text)
    return f"wrote {text}"


def look(name: str) -> str:
    """Reads ``name``."""
    return f"read {name}"


TOOLS = {"fs": [write, look]}


def guard(call: ApprovalRequest) -> str | PolicyDecision:
    """Reading is fine; writing depends on what is written."""
    seen.append(call)
    if call.tool == "look":
        return "allow"
    text = str(call.arguments.get("text", ""))
    if text.startswith("secret"):
        return PolicyDecision(action="deny", reason="no secrets on disk")
    return "ask" if text.startswith("ask") else "allow"


async def async_guard(call: ApprovalRequest) -> str | PolicyDecision:
    return guard(call)


def broken(call: ApprovalRequest) -> str:
    attempts.append(call.call_id)
    raise RuntimeError("policy service unreachable")


def confused(call: ApprovalRequest) -> Any:
    attempts.append(call.call_id)
    return True  # not a decision: a bug retrying cannot fix


@pytest.fixture(autouse=True)
def fresh_state() -> None:
    written.clear()
    seen.clear()
    attempts.clear()


@asynccontextmanager
async def policy_worker(
    client: Client,
    tmp_path: Path,
    python_agents: Sequence[Agent] = (),
    policies: Mapping[str, Callable[..., Any]] | None = None,
    **config: Any,
) -> AsyncIterator[Harness]:
    async with worker_harness(
        client,
        make_settings(tmp_path, **config),
        agents=python_agents,
        function_tools=TOOLS,
        approval_policies=policies,
        default_agent="test",
    ) as h:
        yield h


def playback(tmp_path: Path, *calls: tuple[str, str, dict[str, Any]]) -> str:
    """A script asking for ``calls`` (id, tool, arguments) in one batch, then answering."""
    batch = {"tool_calls": {cid: {"name": name, "arguments": args} for cid, name, args in calls}}
    return str(write_script(tmp_path / f"{uuid.uuid4().hex[:6]}.json", batch, "Done."))


def result_of(result: TurnResult, call_id: str) -> CallToolResult:
    return next(m.tool_results[call_id] for m in result.messages if m.tool_results)


async def policy_activities(turn: TurnHandle) -> int:
    history = await turn.handle.fetch_history()
    return sum(
        1
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == APPROVAL_POLICY
    )


# -- allow, deny, by arguments -------------------------------------------------------------------


async def test_policy_allows_and_denies_by_arguments_and_the_model_sees_why(
    client: Client, tmp_path: Path, fake: FakeModelApi
) -> None:
    # The same tool in one batch: allowed for one text, denied for another; a tool outside the
    # policy's `tools` is never put to it. Registered as an import path in the YAML.
    fake.script(
        Reply.tool_calls(
            ("w1", "fs__write", {"text": "draft"}),
            ("w2", "fs__write", {"text": "secret plan"}),
            ("r1", "fs__look", {"name": "notes"}),
        ),
        Reply.text("Wrote the draft only."),
        api="anthropic",
    )
    agent = {
        "model": "anthropic.test-model",
        "servers": ["fs"],
        "approval": {"policy": "guard", "tools": ["fs__write"]},
    }
    config = {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "approval_policies": {"guard": "tests.test_approval_policy:guard"},
        "agents": {"test": agent},
    }
    async with policy_worker(client, tmp_path, **config) as h:
        turn = await h.start("go")
        result = await turn.result()
        assert await policy_activities(turn) == 1  # one activity for the batch's two writes
    denial = "Tool call denied by policy guard: no secrets on disk"
    assert written == ["draft"]
    assert result_of(result, "w1").text == "wrote draft"
    assert result_of(result, "w2").is_error and result_of(result, "w2").text == denial
    assert result_of(result, "r1").text == "read notes"
    # The denial reached the model through the provider's API, as the call's result.
    second = fake.requests_for("anthropic")[1].body
    [answer] = [
        block
        for message in second["messages"]
        for block in (message["content"] if isinstance(message["content"], list) else [])
        if block.get("type") == "tool_result" and block.get("tool_use_id") == "w2"
    ]
    assert answer.get("is_error") is True and denial in str(answer["content"])
    assert [(d.call_id, d.decision, d.by, d.reason) for d in result.decisions] == [
        ("w1", "approve", "policy:guard", None),
        ("w2", "deny", "policy:guard", "no secrets on disk"),
    ]
    # The policy saw each write with its arguments and the turn's own workflow id.
    assert [(c.call_id, c.server, c.tool, c.arguments["text"]) for c in seen] == [
        ("w1", "fs", "write", "draft"),
        ("w2", "fs", "write", "secret plan"),
    ]
    assert {c.workflow_id for c in seen} == {turn.workflow_id}
    assert {c.agent for c in seen} == {"test"}


# -- ask a person ----------------------------------------------------------------------------------


async def test_policy_asks_and_a_person_approves(client: Client, tmp_path: Path) -> None:
    # A Python agent with the policy function itself: every call of the agent is put to it.
    script = playback(
        tmp_path, ("w1", "fs__write", {"text": "ask first"}), ("r1", "fs__look", {"name": "a"})
    )
    agent = Agent(
        name="test",
        model="playback",
        playback=Path(script),
        tools=["fs"],
        approval=Approval(policy=async_guard, timeout="1h"),
    )
    async with policy_worker(client, tmp_path, python_agents=[agent]) as h:
        turn = await h.start("go")
        [pending] = await eventually(turn.pending_approvals, "the write awaits a person")
        assert (pending.call_id, pending.arguments) == ("w1", {"text": "ask first"})
        assert written == []
        await turn.decide("w1", True, by="alice")
        result = await turn.result()
    assert written == ["ask first"] and result_of(result, "w1").text == "wrote ask first"
    assert result_of(result, "r1").text == "read a"
    assert [(d.call_id, d.decision, d.by) for d in result.decisions] == [
        ("r1", "approve", "policy:async_guard"),
        ("w1", "approve", "alice"),
    ]
    assert [c.call_id for c in seen] == ["w1", "r1"]


# -- a policy that fails ---------------------------------------------------------------------------


async def test_a_failing_policy_denies_and_never_allows(client: Client, tmp_path: Path) -> None:
    def agent(policy: str) -> dict[str, Any]:
        script = playback(tmp_path, ("w1", "fs__write", {"text": "draft"}))
        rules = {"policy": policy}
        return {"model": "playback", "playback": script, "servers": ["fs"], "approval": rules}

    policies = {"broken": broken, "confused": confused}
    agents = {"raises": agent("broken"), "answers_nonsense": agent("confused")}
    async with policy_worker(client, tmp_path, policies=policies, agents=agents) as h:
        raised = await h.run("go", agent="raises")
        assert attempts == ["w1"] * 3  # retried, then given up
        attempts.clear()
        nonsense = await h.run("go", agent="answers_nonsense")
        assert attempts == ["w1"]  # not retried: a wrong answer is a bug
    for result, policy in ((raised, "broken"), (nonsense, "confused")):
        denied = result_of(result, "w1")
        assert denied.is_error
        assert denied.text == f"Tool call denied by policy {policy}: approval policy failed"
        assert [(d.decision, d.by) for d in result.decisions] == [("deny", f"policy:{policy}")]
    assert written == []


# -- untrusted clients and bad configuration -------------------------------------------------------


async def test_crafted_requests_run_no_policy_the_agent_does_not_use(
    client: Client, tmp_path: Path
) -> None:
    agents = {
        "plain": {"model": "playback", "servers": ["fs"]},
        "scoped": {
            "model": "playback",
            "servers": ["fs"],
            "approval": {"policy": "guard", "tools": ["fs__write"]},
        },
        "other": {"model": "playback", "servers": ["fs"], "approval": {"policy": "broken"}},
    }
    policies = {"guard": guard, "broken": broken}
    call = {"call_id": "c1", "name": "fs__write", "arguments": {"text": "x"}}
    crafted_queue = f"crafted-{uuid.uuid4().hex[:10]}"
    async with (
        policy_worker(client, tmp_path, policies=policies, agents=agents) as h,
        Worker(client, task_queue=crafted_queue, workflows=[CraftedWorkflow]),
    ):

        async def crafted(request: dict[str, Any]) -> Any:
            return await client.execute_workflow(
                CraftedWorkflow.run,
                args=[APPROVAL_POLICY, h.task_queue, request, None],
                id=f"crafted-{uuid.uuid4().hex[:8]}",
                task_queue=crafted_queue,
            )

        refusals = {
            "does not use approval policy 'guard' (its policy: none)": {
                "agent": "plain",
                "policy": "guard",
                "calls": [call],
            },
            "does not use approval policy 'guard' (its policy: broken)": {
                "agent": "other",
                "policy": "guard",
                "calls": [call],
            },
            "does not put calls of fs__look to its approval policy": {
                "agent": "scoped",
                "policy": "guard",
                "calls": [{**call, "name": "fs__look"}],
            },
        }
        for text, request in refusals.items():
            with pytest.raises(WorkflowFailureError) as caught:
                await crafted(request)
            error = application_error(caught.value)
            assert error.type == "PolicyNotConfigured" and error.non_retryable
            assert text in error.message, error.message
        # Nor does it run on its own (standalone activity execution), whatever it asks.
        with pytest.raises(Exception) as alone:
            await client.execute_activity(
                APPROVAL_POLICY,
                {"agent": "scoped", "policy": "guard", "calls": [call]},
                id=f"standalone-{uuid.uuid4().hex[:8]}",
                task_queue=h.task_queue,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        assert application_error(alone.value).type == "NotInWorkflow"
        # The same activity with a request the config allows does run the policy.
        allowed = await crafted({"agent": "scoped", "policy": "guard", "calls": [call]})
    assert allowed == {"decisions": {"c1": {"action": "allow", "reason": None}}}
    assert [c.call_id for c in seen] == ["c1"] and attempts == []


async def test_unknown_policy_refused_at_start_and_rules_validated(
    client: Client, tmp_path: Path
) -> None:
    agent = {"model": "playback", "servers": ["fs"], "approval": {"policy": "nope"}}
    with pytest.raises(ValueError, match="agent 'test' names approval policy 'nope'") as raised:
        async with policy_worker(
            client, tmp_path, policies={"guard": guard}, agents={"test": agent}
        ):
            pass
    assert "known: guard" in str(raised.value)
    with pytest.raises(ValueError, match="approval needs `tools`"):
        make_settings(tmp_path, agents={"test": {"approval": {"timeout": "1h"}}})
