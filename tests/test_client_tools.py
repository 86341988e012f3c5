"""Results from the client: a tool marked client-side (YAML ``client_tools``, ``Agent``,
``@fast.tool(client_side=True)``) is offered to the model as ``client__<name>`` and never run by
the worker; its calls wait, like an approval, for a client to submit the result (checked
against the tool's output schema), a denial, or the timeout. Loop control without a server,
then the real dev server, worker and fake model API (and a killed worker process)."""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.client import Client, WorkflowUpdateFailedError

from tests.conftest import answered_at_the_terminal, eventually, turnkeep
from tests.test_approval_durability import still_waiting
from tests.test_durability import Fleet, worker_config
from tests.test_loop import plan
from tests.worker_process import WorkerProcesses
from turnkeep import Settings
from turnkeep.config.agents import Agent, ClientTool, declare
from turnkeep.contract.activity_io import (
    ClientTool as ClientToolPlan,
)
from turnkeep.contract.activity_io import (
    ClientToolsPlan,
    ToolSpec,
)
from turnkeep.contract.approval import ApprovalPlan, Decision, SubmittedResult
from turnkeep.contract.messages import Message, StopReason, ToolCall
from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.fastagent.app import FastAgent
from turnkeep.testing.environment import harness
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.testing.fake_model import FakeModel
from turnkeep.workflows import pending_calls
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits import approval, client_tool, kinds

pytestmark = pytest.mark.asyncio

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PICK_SCHEMA = {
    "type": "object",
    "properties": {"color": {"type": "string"}},
    "required": ["color"],
}


class Pick(BaseModel):
    color: str


def pick_color(hint: str) -> Pick:
    """Ask the person at the client for a color."""
    raise AssertionError("a client-side tool is never called")


# -- loop control (no server) --------------------------------------------------------------------


def _state(**overrides: Any) -> TurnState:
    tools = ClientToolsPlan(
        tools=[
            ClientToolPlan(spec=ToolSpec(name="client__pick"), output_schema=PICK_SCHEMA),
            ClientToolPlan(spec=ToolSpec(name="client__ask")),
        ],
        timeout=60,
    )
    turn_plan = plan(max_iterations=5, has_tools=False, client_tools=tools, **overrides)
    state = TurnState.start(TurnInput(agent="test", messages=["hi"]), turn_plan)
    state.tools = [tool.spec for tool in tools.tools] + [ToolSpec(name="fs__write")]
    state.on_assistant(
        Message(
            role="assistant",
            tool_calls={
                "p": ToolCall(name="client__pick", arguments={"hint": "warm"}),
                "q": ToolCall(name="client__ask"),
                "w": ToolCall(name="fs__write"),
            },
            stop_reason=StopReason.TOOL_USE,
        )
    )
    return state


def _answer(call: str, result: Any = None, **decision: Any) -> Decision:
    submitted = SubmittedResult.of(result) if result is not None else None
    return Decision(
        call_id=call, decision=decision.pop("decision", "approve"), by="app", result=submitted
    )


async def test_client_side_calls_wait_for_their_client_and_need_no_approval() -> None:
    # Every call is gated by approval, yet the client-side ones only wait for their client.
    state = _state(approval=ApprovalPlan(tools=["*"], timeout=10))
    batch = state.tool_batch()
    assert [c.call_id for c in batch.client] == ["p", "q"]
    assert [c.call_id for c in batch.gated] == ["w"] and not batch.to_run
    assert not state.runs_every_pending_call()
    client_tool.hold(state, batch.client[0], NOW)
    [waiting] = pending_calls.waiting_calls(state)
    assert (waiting.kind, waiting.requested_schema) == ("client_result", PICK_SCHEMA)


async def test_a_result_is_checked_against_the_output_schema() -> None:
    state = _state()
    batch = state.tool_batch()
    for call in batch.client:
        client_tool.hold(state, call, NOW)
    problem = functools.partial(kinds.decision_problem, state)
    assert "structured content" in (problem(_answer("p", "red")) or "")
    assert "at color" in (problem(_answer("p", {"color": 3})) or "")
    assert "waits for its result" in (problem(_answer("p")) or "")
    assert "not arguments" in (
        problem(Decision(call_id="p", decision="approve", by="x", arguments={})) or ""
    )
    assert problem(_answer("p", {"color": "red"})) is None
    # An error result needs no structured content; a tool without a schema takes text.
    error = SubmittedResult.of("no", is_error=True)
    assert problem(Decision(call_id="p", decision="approve", by="x", result=error)) is None
    assert problem(_answer("q", "blue")) is None
    assert problem(_answer("q", decision="deny")) is None
    record = kinds.decide(state, _answer("p", {"color": "red"}), NOW)
    assert (record.kind, record.decision, record.by) == ("client_result", "approve", "app")
    result = state.submitted["p"]
    assert result.structured_content == {"color": "red"} and json.loads(result.text) == {
        "color": "red"
    }
    assert "already been decided" in (problem(_answer("p", {"color": "red"})) or "")
    # A timed-out call is denied as an approval is, by the client tools' own timeout.
    timed_out = kinds.KINDS["client_result"].time_out(state, "q", NOW)
    assert timed_out.kind == "client_result"
    assert timed_out.denial().text == "Tool call denied by timeout: no decision within 1m"


async def test_a_result_for_an_approval_call_is_refused() -> None:
    state = _state(approval=ApprovalPlan(tools=["fs__*"], timeout=10))
    [gated] = state.tool_batch().gated
    approval.hold(state, gated, NOW)
    assert "not a client-side tool's" in (kinds.decision_problem(state, _answer("w", "done")) or "")


# -- declaring client tools ----------------------------------------------------------------------


async def test_yaml_agent_and_fast_tool_declare_the_same_spec() -> None:
    yaml = Settings.model_validate(
        {
            "agents": {
                "a": {
                    "client_tools": [
                        {
                            "name": "pick_color",
                            "description": "Ask the person at the client for a color.",
                            "input_schema": {
                                "type": "object",
                                "properties": {"hint": {"type": "string"}},
                                "required": ["hint"],
                            },
                            "output_schema": PICK_SCHEMA,
                        }
                    ],
                    "client_timeout": "2h",
                }
            }
        }
    ).agents["a"]
    python = declare(Settings(), agents=[Agent(name="a", client_tools=[pick_color])])
    fast = FastAgent("x")
    fast.tool(client_side=True)(pick_color)
    fast.agent(name="a")(pick_color)
    from_fast = declare(Settings(), agents=fast.agents)
    [tool] = python.settings.agents["a"].client_tools
    [also] = from_fast.settings.agents["a"].client_tools
    [written] = yaml.client_tools
    assert tool == also
    assert (tool.name, tool.description, tool.output_schema) == (
        written.name,
        written.description,
        written.output_schema,
    )
    assert tool.input_schema["properties"] == written.input_schema["properties"]
    assert yaml.client_timeout == 7200
    assert not from_fast.function_tools  # never served, never called
    with pytest.raises(ValueError, match="server named 'client'"):
        agent = {"servers": ["client"], "client_tools": [{"name": "x"}]}
        Settings.model_validate({"agents": {"a": agent}})
    with pytest.raises(ValueError, match="pattern"):
        ClientTool(name="has space")


# -- on a real server ----------------------------------------------------------------------------


def _tool_results_sent(fake: FakeModel, name: str) -> list[dict[str, Any]]:
    return [
        block
        for message in fake.requests(name)[-1].body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


def pick_once(fake: FakeModel) -> None:
    """The model asks the client for a color (call ``p1``), then answers."""
    fake.script(
        "app",
        Reply.tool_calls(("p1", "client__pick_color", {"hint": "warm"})),
        Reply.text("Red it is."),
    )


def _agent(fake: FakeModel, **options: Any) -> Agent:
    return Agent(
        name="app",
        model=fake.model("app"),
        client_tools=[pick_color, ClientTool(name="confirm", description="Ask to confirm.")],
        **options,
    )


async def test_a_submitted_result_reaches_the_model(
    client: Client, fake_model: FakeModel, temporal: ServerInfo, tmp_path: Path
) -> None:
    fake_model.script(
        "app",
        Reply.tool_calls(
            ("p1", "client__pick_color", {"hint": "warm"}), ("c1", "client__confirm", {})
        ),
        Reply.text("Red it is."),
    )
    async with harness(client, agents=[_agent(fake_model)], fake=fake_model) as h:
        turn = await h.start("pick a color", agent="app")
        calls = await eventually(
            lambda: _waiting(turn, 2), "both client-side calls wait for their client"
        )
        # The model was offered the tools with their specs, under the client__ namespace.
        offered = {t["name"]: t for t in fake_model.requests("app")[0].body["tools"]}
        assert offered["client__pick_color"]["input_schema"]["required"] == ["hint"]
        assert offered["client__confirm"]["description"] == "Ask to confirm."
        assert {(c.call_id, c.kind) for c in calls} == {
            ("p1", "client_result"),
            ("c1", "client_result"),
        }
        assert [c.requested_schema for c in calls if c.call_id == "p1"] == [PICK_SCHEMA]
        # A wrong result is refused with a reason, and the call still waits.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await turn.submit_tool_result("p1", {"colour": "red"}, by="app-ui")
        assert "output schema" in str(refused.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as unknown:
            await turn.submit_tool_result("nope", "x")
        assert "no call 'nope' is waiting" in str(unknown.value.cause)
        assert len(await turn.pending_approvals()) == 2
        record = await turn.submit_tool_result("p1", {"color": "red"}, by="app-ui")
        assert (record.kind, record.by) == ("client_result", "app-ui")
        # The CLI submits the other one (text). In a thread: this process's worker answers.
        done = await asyncio.to_thread(
            turnkeep, "submit", turn.workflow_id, "c1", "--text", "yes", "--by", "cli",
            temporal=temporal, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "submitted the result of call c1" in done.stdout
        result = await turn.result()
    sent = {block["tool_use_id"]: block for block in _tool_results_sent(fake_model, "app")}
    assert json.loads(sent["p1"]["content"][0]["text"]) == {"color": "red"}
    assert sent["c1"]["content"][0]["text"] == "yes" and not sent["c1"].get("is_error")
    assert [(d.call_id, d.by, d.kind) for d in result.decisions] == [
        ("p1", "app-ui", "client_result"),
        ("c1", "cli", "client_result"),
    ]
    assert result.final is not None and result.final.text == "Red it is."


async def _waiting(turn: Any, count: int) -> list[Any] | None:
    calls = await turn.pending_approvals()
    return calls if len(calls) == count else None


async def test_denial_timeout_and_a_result_for_an_approval_call(
    client: Client, fake_model: FakeModel
) -> None:
    fake_model.script(
        "app",
        Reply.tool_calls(
            ("c1", "client__confirm", {}),
            ("c2", "client__confirm", {}),
            ("n1", "app__note", {"text": "hi"}),
        ),
        Reply.text("Fine."),
    )
    # Every call is gated, yet the client-side ones wait only for their client.
    approval = {"tools": ["*"], "timeout": "1h"}
    agent = _agent(fake_model, client_timeout="3s", tools=[note], approval=approval)
    async with harness(client, agents=[agent], fake=fake_model) as h:
        turn = await h.start("go", agent="app")
        calls = await eventually(lambda: _waiting(turn, 3), "every call waits")
        assert {c.call_id: c.kind for c in calls} == {
            "c1": "client_result",
            "c2": "client_result",
            "n1": "approval",
        }
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await turn.submit_tool_result("n1", "made up")
        assert "is not a client-side tool's" in str(refused.value.cause)
        await turn.decide("c1", False, reason="user closed the dialog", by="app-ui")
        await turn.decide("n1", True, by="alice")
        result = await turn.result()
    sent = {block["tool_use_id"]: block for block in _tool_results_sent(fake_model, "app")}
    assert sent["c1"]["is_error"] is True
    assert "denied by app-ui: user closed the dialog" in json.dumps(sent["c1"]["content"])
    assert "denied by timeout: no decision within 3s" in json.dumps(sent["c2"]["content"])
    assert "noted hi" in json.dumps(sent["n1"]["content"])
    assert sorted((d.call_id, d.decision, d.kind) for d in result.decisions) == [
        ("c1", "deny", "client_result"),
        ("c2", "timeout", "client_result"),
        ("n1", "approve", "approval"),
    ]


def note(text: str) -> str:
    """Notes ``text``."""
    return f"noted {text}"


@pytest.mark.slow
async def test_worker_killed_while_a_client_side_call_waits(
    client: Client, temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    task_queue = f"client-{uuid.uuid4().hex[:10]}"
    fake.script(
        Reply.tool_calls(("c1", "client__confirm", {"what": "deploy"})),
        Reply.text("deployed"),
        api="anthropic",
    )
    agent = {
        "model": "anthropic.test-model",
        "client_tools": [{"name": "confirm"}],
        "client_timeout": "1h",
    }
    anthropic = {"api_key": "sk-test", "base_url": fake.base_url_anthropic}
    record = tmp_path / "record.jsonl"
    config = worker_config(tmp_path, task_queue, record, {"app": agent}, anthropic=anthropic)
    with WorkerProcesses(config, temporal.address, tmp_path / "logs") as workers:
        fleet = Fleet(client, workers, task_queue, record)
        first = await fleet.single()
        turn = await fleet.start("app")
        [pending] = await eventually(lambda: still_waiting(turn), "c1 waits for its client")
        workers.kill(first)
        await workers.start_polling(client, task_queue)
        # The new worker replays the turn to the same wait.
        [again] = await eventually(lambda: still_waiting(turn), "c1 still waits")
        await turn.submit_tool_result("c1", "confirmed", by="ops")
        result: TurnResult = await fleet.finish(turn)
    assert pending.kind == again.kind == "client_result" and again.since == pending.since
    answer = next(m.tool_results["c1"] for m in result.messages if m.tool_results)
    assert answer.text == "confirmed" and not answer.is_error
    assert result.final is not None and result.final.text == "deployed"


async def test_the_terminal_prompt_asks_for_the_result_until_it_fits(
    client: Client, fake_model: FakeModel
) -> None:
    """What ``run``, ``watch`` and ``chat`` do at a terminal: ask for the result, as JSON when
    the tool has an output schema, again while the turn refuses it."""
    fake_model.script(
        "app", Reply.tool_calls(("p1", "client__pick_color", {"hint": "warm"})), Reply.text("ok")
    )
    async with harness(client, agents=[_agent(fake_model)], fake=fake_model) as h:
        turn = await h.start("go", agent="app")
        shown = await answered_at_the_terminal(turn, '[1]\n{"color": 3}\n{"color": "red"}\n')
        result = await turn.result()
    assert "result needed · client__pick_color · call p1" in shown
    assert "the result must be a JSON object" in shown
    assert "not submitted: the result does not match the tool's output schema at color" in shown
    assert "submitted the result of call p1" in shown
    [decision] = result.decisions
    assert (decision.by, decision.kind) == ("dana", "client_result")


async def test_pending_names_submit_for_a_client_side_call_and_that_command_answers_it(
    client: Client, fake_model: FakeModel, temporal: ServerInfo, tmp_path: Path
) -> None:
    """`pending` names `turnkeep submit` for a client-side call (with `--json` for a tool with
    an output schema, and its fields), never `turnkeep answer`, which would refuse it."""
    pick_once(fake_model)
    async with harness(client, agents=[_agent(fake_model)], fake=fake_model) as h:
        turn = await h.start("pick a color", agent="app")
        await eventually(lambda: _waiting(turn, 1), "the client-side call waits")
        listed = await asyncio.to_thread(turnkeep, "pending", temporal=temporal, cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        mine = listed.stdout[listed.stdout.index(f"turn {turn.workflow_id}") :].splitlines()
        assert mine[1].startswith(
            "  waiting for a client's result · call p1 (client__pick_color) · since "
        )
        assert mine[2:5] == [
            '    arguments: {"hint": "warm"}',
            "    result fields: color: string",
            f"    decide with: turnkeep submit {turn.workflow_id} p1 --json '{{...}}'",
        ]
        assert not [line for line in mine[:5] if "turnkeep answer" in line]
        done = await asyncio.to_thread(
            turnkeep, "submit", turn.workflow_id, "p1", "--json", '{"color": "red"}',
            temporal=temporal, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        result = await turn.result()
    assert result.final is not None and result.final.text == "Red it is."
    assert [(d.call_id, d.kind) for d in result.decisions] == [("p1", "client_result")]
