"""Human approval of tool calls, on the real dev server: a call the agent's `approval.tools`
name waits durably for the `decide` update (or its timeout) while the batch's other calls run;
approve, deny, edit, timeout, cancel while waiting, refused decisions, the `AwaitingApproval`
search attribute, and the `pending` / `approve` CLI."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client, WorkflowUpdateFailedError

from tests.conftest import HarnessFactory, eventually, turnkeep, write_script
from tests.test_visibility import current_details
from turnkeep.cli.commands.approvals import AWAITING_QUERY
from turnkeep.client.turns import TurnHandle
from turnkeep.config.settings import Settings
from turnkeep.contract.approval import ApprovalPlan, PendingCall
from turnkeep.contract.messages import CallToolResult
from turnkeep.contract.turn_io import TurnCancelledError, TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.observability.search_attributes import SetupError, register
from turnkeep.workflows import visibility
from turnkeep.workflows.repair import INTERRUPTED_TEXT

pytestmark = pytest.mark.asyncio

written: list[str] = []
read: list[str] = []


def write(text: str) -> str:
    """Writes ``text``."""
    written.append(text)
    return f"wrote {text}"


def look(name: str) -> str:
    """Reads ``name``."""
    read.append(name)
    return f"read {name}"


TOOLS = {"fs": [write, look]}


@pytest.fixture(autouse=True)
def fresh_tool_state() -> None:
    written.clear()
    read.clear()


def config(tmp_path: Path, timeout: str = "1d") -> dict[str, Any]:
    """An agent that asks to write (gated) and read (not gated) at once, then answers."""
    script = write_script(
        tmp_path / "script.json",
        {
            "tool_calls": {
                "w1": {"name": "fs__write", "arguments": {"text": "draft"}},
                "r1": {"name": "fs__look", "arguments": {"name": "notes"}},
            }
        },
        "Done.",
    )
    agent = {
        "model": "playback",
        "playback": str(script),
        "servers": ["fs"],
        "approval": {"tools": ["fs__write*"], "timeout": timeout},
    }
    return {"agents": {"test": agent}}


async def waiting(turn: TurnHandle) -> list[PendingCall]:
    return await eventually(turn.pending_approvals, "the write call awaits approval")


def result_of(result: TurnResult, call_id: str) -> CallToolResult:
    return next(m.tool_results[call_id] for m in result.messages if m.tool_results)


async def status(turn: TurnHandle) -> str | None:
    described = await turn.handle.describe()
    return described.typed_search_attributes.get(visibility.STATUS)


# -- rules (pure) --------------------------------------------------------------------------------


async def test_rules_are_globs_on_server_tool_and_timeouts_parse() -> None:
    plan = ApprovalPlan(tools=["fs__write_*", "shell__*"], timeout=1)
    assert plan.needs_approval("fs__write_file") and plan.needs_approval("shell__run")
    assert not plan.needs_approval("fs__read") and not plan.needs_approval("fs__Write_file")
    settings = Settings.model_validate(
        {"agents": {"a": {"approval": {"tools": ["x__*"], "timeout": "2h"}}}}
    )
    rules = settings.agents["a"].approval
    assert rules is not None and rules.timeout == 7200 and rules.on_timeout == "deny"
    with pytest.raises(ValueError, match="on_timeout"):
        Settings.model_validate(
            {"agents": {"a": {"approval": {"tools": ["x"], "on_timeout": "approve"}}}}
        )


# -- decisions -----------------------------------------------------------------------------------


async def test_approve_with_edit_runs_the_edited_call_while_others_ran(
    harness: HarnessFactory, tmp_path: Path, client: Client
) -> None:
    async with harness(TOOLS, **config(tmp_path)) as h:
        turn = await h.start("go")
        [pending] = await waiting(turn)
        assert (pending.call_id, pending.name, pending.arguments) == (
            "w1",
            "fs__write",
            {"text": "draft"},
        )
        # The ungated call of the batch ran; the gated one did not.
        await eventually(lambda: read == ["notes"], "the read call ran")
        assert written == []
        # One query finds every turn awaiting approval.
        await eventually(lambda: _status_is(turn, "AwaitingApproval"), "status AwaitingApproval")
        await eventually(lambda: _lists(client, turn.workflow_id), "the list query finds the turn")
        # The Web UI's current details say which call waits, and since when.
        details = await current_details(turn)
        assert "awaiting approval" in details and "`fs__write` · call `w1` · since" in details

        # Once the read has run, the line on what the turn does no longer lists it.
        async def doing() -> str:
            return (await current_details(turn)).splitlines()[0]

        await eventually(
            lambda: _says(doing, "· waiting on approval (1 call)"),
            "details without the finished call",
        )
        record = await turn.decide("w1", True, by="alice", arguments={"text": "final"})
        assert record.arguments == {"text": "final"}
        assert record.original_arguments == {"text": "draft"}
        result = await turn.result()
    assert written == ["final"]
    assert result_of(result, "w1").text == "wrote final"
    assert result_of(result, "r1").text == "read notes"
    [decision] = result.decisions
    assert (decision.by, decision.decision, decision.tool) == ("alice", "approve", "fs__write")
    assert await status(turn) == "Completed"


async def _says(text: Callable[[], Awaitable[str]], ending: str) -> bool:
    return (await text()).endswith(ending)


async def _status_is(turn: TurnHandle, expected: str) -> bool:
    return await status(turn) == expected


async def _lists(client: Client, workflow_id: str) -> bool:
    return workflow_id in {w.id async for w in client.list_workflows(AWAITING_QUERY)}


async def test_deny_answers_with_an_error_the_model_sees(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    async with harness(TOOLS, **config(tmp_path)) as h:
        turn = await h.start("go")
        await waiting(turn)
        await turn.decide("w1", False, reason="not today", by="bob")
        result = await turn.result()
    denied = result_of(result, "w1")
    assert denied.is_error and denied.text == "Tool call denied by bob: not today"
    assert written == [] and result.final is not None and result.final.text == "Done."
    assert [(d.decision, d.by, d.reason) for d in result.decisions] == [
        ("deny", "bob", "not today")
    ]


async def test_no_decision_in_time_denies_by_timeout(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    async with harness(TOOLS, **config(tmp_path, timeout="2s")) as h:
        result = await h.run("go")
    denied = result_of(result, "w1")
    assert denied.is_error
    assert denied.text == "Tool call denied by timeout: no decision within 2s"
    assert [d.decision for d in result.decisions] == ["timeout"] and written == []


async def test_cancel_while_waiting_repairs_the_call(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    async with harness(TOOLS, **config(tmp_path)) as h:
        turn = await h.start("go")
        await waiting(turn)
        await eventually(lambda: read == ["notes"], "the read call ran")
        await turn.cancel()
        with pytest.raises(TurnCancelledError) as raised:
            await turn.result()
    repaired = raised.value.result
    assert repaired is not None
    assert INTERRUPTED_TEXT in result_of(repaired, "w1").text
    assert await status(turn) == "Cancelled"


async def test_bad_decisions_are_refused_and_the_turn_goes_on(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    async with harness(TOOLS, **config(tmp_path)) as h:
        turn = await h.start("go")
        await waiting(turn)
        refusals = {
            "no call 'nope' is waiting": turn.decide("nope", True, by="eve"),
            "is waiting for approval": turn.decide("r1", True, by="eve"),  # not gated
            "only with an approval": turn.decide("w1", False, by="eve", arguments={"x": 1}),
            "not a Decision": turn.handle.execute_update("decide", {"call_id": "w1"}),
            "one argument": turn.handle.execute_update("decide", args=["w1", "approve"]),
        }
        for text, attempt in refusals.items():
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await attempt
            assert text in str(refused.value.cause), text
        assert [c.call_id for c in await turn.pending_approvals()] == ["w1"]
        await turn.decide("w1", True, by="alice")
        with pytest.raises(WorkflowUpdateFailedError) as again:
            await turn.decide("w1", False, by="eve")
        assert "already been decided" in str(again.value.cause)
        result = await turn.result()
    assert written == ["draft"] and [d.by for d in result.decisions] == ["alice"]


# -- CLI -----------------------------------------------------------------------------------------


async def test_cli_lists_pending_calls_and_approves_one(
    harness: HarnessFactory, tmp_path: Path, temporal: ServerInfo
) -> None:
    async with harness(TOOLS, **config(tmp_path)) as h:
        turn = await h.start("go")
        await waiting(turn)
        await eventually(lambda: _status_is(turn, "AwaitingApproval"), "status AwaitingApproval")

        # In a thread: the CLI's query and update are answered by this process's worker.
        async def listed() -> list[dict[str, Any]]:
            out = await asyncio.to_thread(
                turnkeep, "pending", "--json", temporal=temporal, cwd=tmp_path
            )
            assert out.returncode == 0, out.stderr
            return [t for t in json.loads(out.stdout) if t["workflow_id"] == turn.workflow_id]

        [entry] = await eventually(listed, "pending lists the turn")
        assert [(c["call_id"], c["arguments"]) for c in entry["calls"]] == [
            ("w1", {"text": "draft"})
        ]
        # A refused decision, and a start under the waiting turn's id, say why in one line.
        wrong, taken = await asyncio.gather(
            asyncio.to_thread(
                turnkeep, "approve", turn.workflow_id, "call_9_9", temporal=temporal, cwd=tmp_path
            ),
            asyncio.to_thread(
                turnkeep, "run", "hi", "--id", turn.workflow_id, temporal=temporal, cwd=tmp_path
            ),
        )
        assert (wrong.returncode, wrong.stdout) == (2, "")
        assert wrong.stderr == ("error: no call 'call_9_9' is waiting for approval (waiting: w1)\n")
        assert (taken.returncode, taken.stdout) == (2, "")
        assert taken.stderr == (
            f"error: a workflow with id {turn.workflow_id!r} is already running (choose "
            "another --id)\n"
        )
        out = await asyncio.to_thread(
            turnkeep,
            "approve",
            turn.workflow_id,
            "w1",
            "--deny",
            "--reason",
            "no",
            "--by",
            "carol",
            temporal=temporal,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr
        assert "denied call w1" in out.stdout
        result = await turn.result()
    assert result_of(result, "w1").text == "Tool call denied by carol: no"
    again = turnkeep("approve", turn.workflow_id, "w1", temporal=temporal, cwd=tmp_path)
    assert again.returncode == 2 and again.stderr == (
        "error: that turn or session has already ended, so nothing waits there any more "
        "(`turnkeep show ID` says how it ended)\n"
    )
    shown = turnkeep("show", turn.workflow_id, temporal=temporal, cwd=tmp_path)
    assert "decision: denied call w1 (fs__write) · by carol at " in shown.stdout, shown.stdout


async def test_pending_with_nothing_waiting_says_so_for_every_kind_of_wait(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    """Approvals are not all that waits (answers, client results and budgets do too): an empty
    `pending` says that no turn waits, not that none awaits approval. In a namespace of its
    own, where no other test's turn waits."""
    namespace = f"empty-{uuid.uuid4().hex[:8]}"
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )

    async def registered() -> bool:
        try:
            await register(await Client.connect(temporal.address, namespace=namespace))
        except SetupError:
            return False  # the new namespace is not known everywhere yet
        return True

    await eventually(registered, "the namespace has turnkeep's search attributes")

    async def listed() -> str | None:
        out = await asyncio.to_thread(
            turnkeep, "pending", "--namespace", namespace, temporal=temporal, cwd=tmp_path
        )
        return out.stdout if out.returncode == 0 else None

    shown = await eventually(listed, "pending lists the new namespace", within=90)
    assert shown == "no turn is waiting for a person or a client\n"
