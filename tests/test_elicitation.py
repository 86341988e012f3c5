"""MCP elicitation and sampling during a tool call, on the real dev server with a real FastMCP
server (stdio, ``tests/mcp_servers/asking_server.py``): the call suspends with what the server
asked, the turn waits like an approval (no activity running) or samples the model, and the
call runs again with the answers. Answered, declined, cancelled, timed out, refused by the
server's config, bad content refused, sampling through the fake model API with its usage
counted; and the pure rules (content checked against the requested schema)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError

from tests.conftest import HarnessFactory, eventually
from tests.test_visibility import current_details
from turnkeep.client.turns import TurnHandle
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.fake_api import FakeModelApi, Reply, Tokens
from turnkeep.testing.fake_model import FakeModel
from turnkeep.workflows.approval import PendingCall
from turnkeep.workflows.messages import CallToolResult
from turnkeep.workflows.server_requests import content_problem
from turnkeep.workflows.turn_io import TurnResult

pytestmark = pytest.mark.asyncio

SERVER = Path(__file__).parent / "mcp_servers" / "asking_server.py"
BOOK = '***CALL_TOOL shows__book {"show": "Hamlet"}'
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "seats": {"type": "integer", "minimum": 1}},
    "required": ["name", "seats"],
}


def server(record: Path, **asks: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(SERVER)],
        "env": {"TURNKEEP_TEST_RECORD": str(record)},
        **asks,
    }


def config(record: Path, *, agent: dict[str, Any] | None = None, **asks: Any) -> dict[str, Any]:
    return {
        "mcp": {"servers": {"shows": server(record, **asks)}},
        "agents": {"test": {"model": "passthrough", "servers": ["shows"], **(agent or {})}},
    }


def runs(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


def tool_result(result: TurnResult) -> CallToolResult:
    return next(r for m in result.messages if m.tool_results for r in m.tool_results.values())


async def asked(turn: TurnHandle) -> PendingCall:
    [pending] = await eventually(turn.pending_approvals, "the elicitation waits")
    return pending


# -- rules (pure) ----------------------------------------------------------------------------


async def test_content_is_checked_against_the_requested_schema() -> None:
    assert content_problem(SCHEMA, {"name": "Ann", "seats": 2}) is None
    assert content_problem(SCHEMA, {"name": "Ann"}) == "field 'seats' is required"
    assert content_problem(SCHEMA, {"name": "Ann", "seats": "2"}) == (
        "field 'seats' must be an integer"
    )
    assert (
        content_problem(SCHEMA, {"name": "Ann", "seats": 0}) == "field 'seats' must be at least 1"
    )
    assert "not in the requested schema" in (
        content_problem(SCHEMA, {"name": "A", "seats": 1, "x": 1}) or ""
    )
    choice = {"type": "object", "properties": {"tier": {"type": "string", "enum": ["a", "b"]}}}
    assert content_problem(choice, {"tier": "c"}) == "field 'tier' must be one of ['a', 'b']"
    flag = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    assert content_problem(flag, {"ok": 1}) == "field 'ok' must be true or false"


# -- elicitation -----------------------------------------------------------------------------


async def test_an_answer_resumes_the_tool_with_it(harness: HarnessFactory, tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    async with harness(**config(record, elicitation={"mode": "forms"})) as h:
        turn = await h.start(BOOK)
        pending = await asked(turn)
        assert pending.kind == "elicitation" and pending.call_id.endswith(":elicit:1")
        assert pending.prompt == "Who is booking for Hamlet, and how many seats?"
        assert pending.requested_schema is not None
        assert set(pending.requested_schema["properties"]) == {"name", "seats"}
        details = await current_details(turn)
        assert "awaiting input" in details and pending.call_id in details
        # Bad content is refused, naming the field; the turn still waits.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await turn.answer_elicitation(pending.call_id, {"name": "Ann", "seats": "two"})
        assert "field 'seats' must be an integer" in str(refused.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await turn.decide(pending.call_id, False, by="t", arguments={"x": 1})
        assert "arguments" in str(refused.value.cause)
        assert [p.call_id for p in await turn.pending_approvals()] == [pending.call_id]
        record_ = await turn.answer_elicitation(
            pending.call_id, {"name": "Ann", "seats": 2}, by="ann"
        )
        assert record_.kind == "elicitation" and record_.approved
        result = await turn.result()
    assert tool_result(result).text == "booked 2 seats for Ann at Hamlet"
    # The first run asked and ended; the second ran the tool from the start, was asked the
    # same and answered from the recorded answer (MCP's retry with the answer: a third leg).
    assert runs(record) == ["book Hamlet asking", "book Hamlet asking", "book Hamlet answered"]
    [decision] = result.decisions
    assert (decision.call_id, decision.by, decision.kind) == (pending.call_id, "ann", "elicitation")


@pytest.mark.parametrize(("how", "said"), [("decline", "decline"), ("cancel", "cancel")])
async def test_a_decline_or_cancel_reaches_the_server(
    harness: HarnessFactory, tmp_path: Path, how: str, said: str
) -> None:
    record = tmp_path / "record.txt"
    async with harness(**config(record, elicitation={})) as h:
        turn = await h.start(BOOK)
        pending = await asked(turn)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await turn.handle.execute_update(
                "decide",
                {"call_id": pending.call_id, "decision": "deny", "by": "t", "content": {"a": 1}},
            )
        assert "content goes only with an answer" in str(refused.value.cause)
        flags = {"decline": how == "decline", "cancel": how == "cancel"}
        await turn.answer_elicitation(pending.call_id, by="bob", **flags)
        result = await turn.result()
    assert tool_result(result).text == f"not booked: {said}"
    assert not result.decisions[0].approved


async def test_nobody_answering_in_time_is_a_cancel(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    record = tmp_path / "record.txt"
    async with harness(**config(record, elicitation={"timeout": 1})) as h:
        result = await h.run(BOOK)
    assert tool_result(result).text == "not booked: cancel"
    [decision] = result.decisions
    assert (decision.decision, decision.by, decision.kind) == ("timeout", "timeout", "elicitation")


async def test_auto_cancel_answers_at_once_and_is_recorded(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    record = tmp_path / "record.txt"
    async with harness(**config(record, elicitation={"mode": "auto-cancel"})) as h:
        result = await h.run(BOOK)
    assert tool_result(result).text == "not booked: cancel"
    assert runs(record) == ["book Hamlet asking", "book Hamlet answered"]
    [decision] = result.decisions
    assert (decision.decision, decision.by, decision.kind) == (
        "deny",
        "policy:mcp-server",
        "elicitation",
    )
    assert decision.reason == "elicitation mode is auto-cancel"


async def test_a_server_without_elicitation_is_refused_at_once(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    record = tmp_path / "record.txt"
    async with harness(**config(record, elicitation={"mode": "none"})) as h:
        result = await h.run(BOOK)
    # No capability advertised: the client refuses the request, the call ends with an error
    # and no one waits.
    assert tool_result(result).is_error
    assert runs(record) == ["book Hamlet asking"]
    assert result.decisions == []


# -- sampling --------------------------------------------------------------------------------


async def test_sampling_runs_on_the_agents_model_and_counts_its_usage(
    client: Client, fake_model: FakeModel, fake: FakeModelApi, tmp_path: Path
) -> None:
    record = tmp_path / "record.txt"
    model = fake_model.script(
        "sampler",
        Reply.tool_calls(("c1", "shows__summarise", {"text": "a long play"})),
        Reply.text("Prince avenges father, dies.", usage=Tokens(input=40, output=6)),
        Reply.text("Done.", usage=Tokens(input=80, output=2)),
    )
    settings = {
        "mcp": {"servers": {"shows": server(record, sampling={})}},
        "agents": {"test": {"model": model, "servers": ["shows"]}},
    }
    from turnkeep.config.settings import Settings

    async with worker_harness(
        client, Settings.model_validate({**settings, "base_dir": tmp_path}), fake=fake_model
    ) as h:
        result = await h.run("summarise it", agent="test")
    assert tool_result(result).text == "summary: Prince avenges father, dies."
    sampled = fake_model.requests("sampler")[1].body
    assert sampled["system"] == "Answer in five words." and sampled["max_tokens"] == 50
    assert json.dumps(sampled["messages"]).count("Summarise: a long play") == 1
    assert sampled.get("tools") in (None, [])
    usage = result.usage[model]
    assert usage.calls == 3
    del fake
