"""MCP elicitation and sampling during a tool call, on the real dev server with a real FastMCP
server (stdio, ``tests/mcp_servers/asking_server.py``): the call suspends with what the server
asked, the turn waits like an approval (no activity running) or samples the model, and the
call runs again with the answers. Answered, declined, cancelled, timed out, refused by the
server's config, bad content refused, sampling through the fake model API with its usage
counted; servers that ask with ``ctx.elicit`` (FastMCP's, MCP's SDK's, the documented example)
under the default protocol_mode, and the fix named when their request cannot get through; and
the pure rules (content checked against the requested schema)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mcp_types
import pytest
import yaml
from mcp.shared.exceptions import MCPError, NoBackChannelError
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from tests import test_loop
from tests.conftest import HarnessFactory, eventually, turnkeep
from tests.mcp_servers.launch import http_server
from tests.test_docs import ROOT, titled_blocks
from tests.test_visibility import current_details
from tests.worker_process import FLEET_ENV, WorkerProcesses, write_config
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.config.settings import McpElicitationSettings, Settings
from turnkeep.contract.activity_io import ToolCallRequest
from turnkeep.contract.approval import Decision, PendingCall
from turnkeep.contract.messages import CallToolResult
from turnkeep.contract.server_requests import ServerAnswer, ServerRequest, content_problem
from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.fake_api import FakeModelApi, Reply, Tokens
from turnkeep.testing.fake_model import FakeModel
from turnkeep.tools.protocol_era import fix_for, refused_request, with_fix
from turnkeep.tools.server_requests import RequestBook, Suspended
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits import approval, kinds, server_ask

pytestmark = pytest.mark.asyncio

SERVER = Path(__file__).parent / "mcp_servers" / "asking_server.py"
SDK_SERVER = Path(__file__).parent / "mcp_servers" / "sdk_asking_server.py"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "elicitation"
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


def _waiting_state(schema: dict[str, Any] | None = SCHEMA) -> tuple[TurnState, str]:
    state = TurnState.start(TurnInput(agent="a", messages=["hi"]), test_loop.plan())
    call = ToolCallRequest(agent="a", call_id="c1", name="shows__book", arguments={})
    request = ServerRequest(
        kind="elicitation", digest="d", server="shows", message="Who?", requested_schema=schema
    )
    server_ask.hold(state, call, "c1:elicit:1", request, datetime.now(UTC))
    return state, "c1:elicit:1"


def _decision(**fields: Any) -> Decision:
    return Decision.model_validate({"call_id": "c1:elicit:1", "by": "t", **fields})


async def test_an_elicitation_is_answered_declined_cancelled_or_timed_out_without_a_server() -> (
    None
):
    state, id = _waiting_state()
    assert state.pending_approvals[id].kind == "elicitation"
    assert kinds.decision_problem(state, _decision(decision="approve", content={"name": "A"})) == (
        "the content does not match the requested schema: field 'seats' is required"
    )
    assert "goes only with deny" in (
        kinds.decision_problem(state, _decision(decision="approve", content={}, cancel=True)) or ""
    )
    assert "arguments" in (
        kinds.decision_problem(state, _decision(decision="approve", arguments={})) or ""
    )
    good = _decision(decision="approve", content={"name": "A", "seats": 2.0})
    assert kinds.decision_problem(state, good) is None
    record = kinds.decide(state, good, datetime.now(UTC))
    assert (record.kind, record.approved) == ("elicitation", True)
    # JSON's 2.0 is the integer the schema asks for.
    assert state.server_answers[id].result == {
        "action": "accept",
        "content": {"name": "A", "seats": 2},
    }
    for fields, action in (
        ({"decision": "deny"}, "decline"),
        ({"decision": "deny", "cancel": True}, "cancel"),
    ):
        state, id = _waiting_state()
        kinds.decide(state, _decision(**fields), datetime.now(UTC))
        assert state.server_answers[id].result == {"action": action}
    state, id = _waiting_state()
    timed_out = kinds.KINDS["elicitation"].time_out(state, id, datetime.now(UTC))
    assert (timed_out.decision, timed_out.kind) == ("timeout", "elicitation")
    assert state.server_answers[id].result == {"action": "cancel"}
    # An approval's own kind takes no content.
    state, _ = _waiting_state()
    approval.hold(
        state, ToolCallRequest(agent="a", call_id="c2", name="x", arguments={}), datetime.now(UTC)
    )
    problem = kinds.decision_problem(
        state, Decision(call_id="c2", decision="approve", by="t", content={})
    )
    assert problem is not None and "answer an elicitation" in problem


async def test_a_run_answers_what_the_server_asks_again_in_order_and_suspends_on_the_new() -> None:
    params = mcp_types.ElicitRequestFormParams(message="Who?", requested_schema=SCHEMA)
    other = mcp_types.ElicitRequestFormParams(message="Sure?", requested_schema=SCHEMA)
    forms = McpElicitationSettings(mode="forms")
    first = RequestBook("shows", [], forms, None)
    with pytest.raises(Suspended):
        first.elicit(params)
    assert first.needed is not None and first.needed.message == "Who?"
    answer = ServerAnswer(
        kind="elicitation",
        digest=first.needed.digest,
        result={"action": "accept", "content": {"name": "A", "seats": 1}},
    )
    second = RequestBook("shows", [answer], forms, None)
    assert second.elicit(params).action == "accept"
    with pytest.raises(Suspended):  # a new request: asked again (n+1)
        second.elicit(other)
    assert second.needed is not None and second.needed.message == "Sure?"
    cancelling = RequestBook("shows", [], McpElicitationSettings(mode="auto-cancel"), None)
    assert cancelling.elicit(params).action == "cancel"
    assert [d.reason for d in cancelling.declined] == ["elicitation mode is auto-cancel"]
    sampling = mcp_types.CreateMessageRequestParams(messages=[], max_tokens=5)
    with pytest.raises(RuntimeError, match="sampling is not enabled"):
        cancelling.sample(sampling)


async def test_a_request_refused_for_want_of_a_channel_is_recognised_and_its_fix_named() -> None:
    fastmcp_says = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(
                type="text",
                text="elicitation via server-initiated requests is unavailable on 2026-07-28 "
                "connections.",
            )
        ],
        is_error=True,
    )
    assert refused_request(fastmcp_says) == "elicitation"
    assert refused_request(fastmcp_says.model_copy(update={"is_error": False})) is None
    sdk_says = NoBackChannelError("sampling/createMessage")
    assert refused_request(sdk_says) == "sampling"
    assert refused_request(MCPError(-32602, "Unknown tool: 'x'")) is None
    fix = fix_for("desk", "sampling", enabled=False, protocol_mode="auto")
    assert "add `sampling: {}` to `mcp.servers.desk`" in fix
    fix = fix_for("desk", "elicitation", enabled=True, protocol_mode="legacy")
    assert "must ask by returning an InputRequiredResult" in fix
    fixed = with_fix(sdk_says, "do this")
    assert isinstance(fixed, MCPError) and fixed.message.endswith("(do this)")
    assert fixed.code == sdk_says.code


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


@pytest.mark.slow  # the command line in subprocesses
async def test_pending_shows_the_question_and_answer_answers_it(
    harness: HarnessFactory, tmp_path: Path, temporal: ServerInfo
) -> None:
    record = tmp_path / "record.txt"
    async with harness(**config(record, elicitation={})) as h:
        turn = await h.start(BOOK)
        pending = await asked(turn)

        def cli(*args: str) -> Any:
            return turnkeep(*args, temporal=temporal, cwd=tmp_path)

        listed = await asyncio.to_thread(cli, "pending")
        assert (
            f"waiting for an answer · {pending.call_id} (shows__book) asks: Who is booking for "
            "Hamlet, and how many seats? · since "
        ) in listed.stdout
        assert "answer fields: name: string, seats: integer" in listed.stdout
        assert (
            f"decide with: turnkeep answer {turn.workflow_id} {pending.call_id} --json '{{...}}' "
            "| --decline | --cancel"
        ) in listed.stdout
        bad = '{"name": "Dee", "seats": "x"}'
        wrong = await asyncio.to_thread(
            cli, "answer", turn.workflow_id, pending.call_id, "--json", bad
        )
        assert wrong.returncode == 2
        assert "field 'seats' must be an integer" in wrong.stderr
        good = '{"name": "Dee", "seats": 1}'
        out = await asyncio.to_thread(
            cli, "answer", turn.workflow_id, pending.call_id, "--json", good
        )
        assert out.returncode == 0, out.stderr
        assert f"answered {pending.call_id} (shows__book)" in out.stdout
        result = await turn.result()
    assert tool_result(result).text == "booked 1 seats for Dee at Hamlet"


async def test_an_older_connection_runs_one_call_at_a_time_and_attributes_each_request(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    """On a 2025-11-25 connection a server's elicitation is a request of its own that does not
    say which call it is for: two calls of one batch each get their own answer."""
    record = tmp_path / "record.txt"
    prompt = (
        '***CALL_TOOL shows__book_push {"show": "Hamlet"}\n'
        '***CALL_TOOL shows__book_push {"show": "Lear"}'
    )
    async with harness(**config(record, elicitation={}, protocol_mode="legacy")) as h:
        turn = await h.start(prompt)
        waiting = await eventually(lambda: _both(turn), "both calls' elicitations wait", within=30)
        for call in waiting:
            show = "Hamlet" if "Hamlet" in (call.prompt or "") else "Lear"
            await turn.answer_elicitation(call.call_id, {"name": show[0], "seats": len(show)})
        result = await turn.result()
    texts = sorted(
        r.text for m in result.messages if m.tool_results for r in m.tool_results.values()
    )
    assert texts == ["booked 4 seats for L at Lear", "booked 6 seats for H at Hamlet"]
    # Each first run was told "cancel" (and its result set aside), each re-run accepted.
    assert sorted(runs(record)) == [
        "book_push Hamlet accept",
        "book_push Hamlet cancel",
        "book_push Lear accept",
        "book_push Lear cancel",
    ]


async def _both(turn: TurnHandle) -> list[PendingCall] | None:
    waiting = await turn.pending_approvals()
    return waiting if len(waiting) == 2 else None


# -- servers that ask with ctx.elicit, under the default protocol_mode -----------------------


def example_settings(monkeypatch: pytest.MonkeyPatch, **server: Any) -> Settings:
    """The documented example (``examples/elicitation``): its turnkeep.yaml's server as written
    (``server``: keys changed), and a passthrough agent to call its tools."""
    # The example's `python` is this interpreter, as in the virtualenv a reader works in.
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))
    written = yaml.safe_load((EXAMPLE / "turnkeep.yaml").read_text(encoding="utf-8"))
    desk = {**written["mcp"]["servers"]["desk"], **server}
    return Settings.model_validate(
        {
            "base_dir": EXAMPLE,
            "mcp": {"servers": {"desk": desk}},
            "agents": {"test": {"model": "passthrough", "servers": ["desk"]}},
        }
    )


async def test_the_documented_example_is_the_file_that_runs() -> None:
    blocks = titled_blocks(ROOT / "docs" / "elicitation.md")
    for name in ("names_server.py", "turnkeep.yaml"):
        assert blocks[name] == (EXAMPLE / name).read_text(encoding="utf-8"), name


async def test_a_server_asking_with_ctx_elicit_is_answered_under_the_default_protocol_mode(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastMCP's docs' `ctx.elicit(..., response_type=str)` and a dataclass form, with only
    `elicitation` in the server's config: each is asked and answered like any elicitation."""
    settings = example_settings(monkeypatch)
    assert settings.mcp.servers["desk"].protocol_mode == "auto"
    async with worker_harness(client, settings, default_agent="test") as h:
        turn = await h.start("***CALL_TOOL desk__greet {}")
        pending = await asked(turn)
        assert (pending.kind, pending.prompt) == ("elicitation", "What is your name?")
        assert pending.requested_schema is not None
        assert list(pending.requested_schema["properties"]) == ["value"]
        await turn.answer_elicitation(pending.call_id, {"value": "Ann"}, by="ann")
        greeted = await turn.result()
        assert tool_result(greeted).text == "Hello, Ann!"
        assert not tool_result(greeted).is_error

        turn = await h.start('***CALL_TOOL desk__book {"show": "Hamlet"}')
        pending = await asked(turn)
        assert pending.prompt == "Who is booking for Hamlet?"
        assert pending.requested_schema is not None
        assert set(pending.requested_schema["properties"]) == {"name", "seats"}
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await turn.answer_elicitation(pending.call_id, {"name": "Ann", "seats": "two"})
        assert "field 'seats' must be an integer" in str(refused.value.cause)
        await turn.answer_elicitation(pending.call_id, {"name": "Ann", "seats": 2}, by="ann")
        booked = await turn.result()
    assert tool_result(booked).text == "Booked 2 seats for Ann at Hamlet."
    assert [d.by for d in booked.decisions] == ["ann"]


@pytest.mark.parametrize("how", ["decline", "cancel"])
async def test_a_ctx_elicit_decline_or_cancel_reaches_the_server(
    client: Client, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    async with worker_harness(client, example_settings(monkeypatch), default_agent="test") as h:
        turn = await h.start("***CALL_TOOL desk__greet {}")
        pending = await asked(turn)
        flags = {"decline": how == "decline", "cancel": how == "cancel"}
        await turn.answer_elicitation(pending.call_id, by="bob", **flags)
        result = await turn.result()
    assert tool_result(result).text == f"No name given ({how})."
    assert not result.decisions[0].approved


@pytest.mark.parametrize(
    ("server", "fix"),
    [
        (
            {"protocol_mode": "modern"},
            "set `protocol_mode: auto` (or `legacy`) on `mcp.servers.desk`",
        ),
        ({"elicitation": None}, "add `elicitation: {mode: forms}` to `mcp.servers.desk`"),
        ({"elicitation": {"mode": "none"}}, "add `elicitation: {mode: forms}`"),
    ],
    ids=["pinned-modern", "no-elicitation", "mode-none"],
)
async def test_a_request_the_connection_cannot_carry_names_the_fix(
    client: Client, monkeypatch: pytest.MonkeyPatch, server: dict[str, Any], fix: str
) -> None:
    settings = example_settings(monkeypatch, **server)
    async with worker_harness(client, settings, default_agent="test") as h:
        result = await h.run("***CALL_TOOL desk__greet {}")
    failed = tool_result(result)
    assert failed.is_error
    assert "server-initiated requests is unavailable on 2026-07-28" in failed.text
    assert fix in failed.text
    assert result.decisions == []


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_one_server_asks_both_ways_under_the_default_protocol_mode(
    harness: HarnessFactory, tmp_path: Path, transport: str
) -> None:
    """A tool that asks with ctx.elicit runs on a handshake connection, where its request
    travels; one that returns an InputRequiredResult stays on the 2026-07-28 one."""
    record = tmp_path / "record.txt"
    push = '***CALL_TOOL shows__book_push {"show": "Lear"}'
    async with contextlib.AsyncExitStack() as stack:
        if transport == "http":
            env = {"TURNKEEP_TEST_RECORD": str(record)}
            url = await stack.enter_async_context(http_server(env=env, script=SERVER))
            shows: dict[str, Any] = {"url": url, "elicitation": {}}
        else:
            shows = server(record, elicitation={})
        settings = {
            "mcp": {"servers": {"shows": shows}},
            "agents": {"test": {"model": "passthrough", "servers": ["shows"]}},
        }
        h = await stack.enter_async_context(harness(**settings))
        for prompt, answer in (
            (push, {"name": "Lu", "seats": 4}),
            (BOOK, {"name": "Ed", "seats": 6}),
        ):
            turn = await h.start(prompt)
            pending = await asked(turn)
            await turn.answer_elicitation(pending.call_id, answer)
            texts = [tool_result(await turn.result()).text]
            # Again: the tool known to ask its own way goes to the handshake connection at once.
            turn = await h.start(prompt)
            await turn.answer_elicitation((await asked(turn)).call_id, answer)
            texts.append(tool_result(await turn.result()).text)
            assert len(set(texts)) == 1, texts
    assert runs(record) == [
        # The first run on a 2026-07-28 connection failed at ctx.elicit, before its record.
        *["book_push Lear cancel", "book_push Lear accept"] * 2,
        *["book Hamlet asking", "book Hamlet asking", "book Hamlet answered"] * 2,
    ]


async def test_a_server_on_mcps_own_sdk_asking_with_ctx_elicit_is_answered(
    harness: HarnessFactory,
) -> None:
    """MCP's SDK refuses the request on a 2026-07-28 connection with a JSON-RPC error rather
    than an error result: the same handshake connection carries it."""
    sdk = {"command": sys.executable, "args": [str(SDK_SERVER)], "elicitation": {}}
    settings = {
        "mcp": {"servers": {"shows": sdk}},
        "agents": {"test": {"model": "passthrough", "servers": ["shows"]}},
    }
    async with harness(**settings) as h:
        turn = await h.start(BOOK)
        pending = await asked(turn)
        assert pending.prompt == "Who is booking for Hamlet?"
        await turn.answer_elicitation(pending.call_id, {"name": "Bo", "seats": 3})
        result = await turn.result()
    assert tool_result(result).text == "booked 3 seats for Bo at Hamlet"


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


async def test_sampling_waits_for_approval_when_configured_and_a_denial_refuses_it(
    client: Client, fake_model: FakeModel, tmp_path: Path
) -> None:
    record = tmp_path / "record.txt"
    model = fake_model.script(
        "approver",
        Reply.tool_calls(("c1", "shows__summarise", {"text": "a long play"})),
        Reply.text("Done."),
    )
    settings = {
        "base_dir": tmp_path,
        "mcp": {"servers": {"shows": server(record, sampling={"approval": True})}},
        "agents": {"test": {"model": model, "servers": ["shows"]}},
    }
    async with worker_harness(client, Settings.model_validate(settings), fake=fake_model) as h:
        turn = await h.start("summarise it", agent="test")
        pending = await asked(turn)
        assert (pending.kind, pending.call_id) == ("sampling", "c1:sample:1")
        assert pending.prompt == "shows asks the model: Summarise: a long play"
        await turn.decide(pending.call_id, False, reason="not now", by="eve")
        result = await turn.result()
    # Denied: no model call was made for it, and the server got an error.
    assert len(fake_model.requests("approver")) == 2
    assert tool_result(result).is_error
    assert "sampling was not approved" in tool_result(result).text
    [decision] = result.decisions
    assert (decision.kind, decision.decision, decision.by) == ("sampling", "deny", "eve")


async def test_sampling_asked_with_a_request_of_its_own_runs_under_the_default_protocol_mode(
    client: Client, fake_model: FakeModel, tmp_path: Path
) -> None:
    model = fake_model.script(
        "sdk-sampler",
        Reply.tool_calls(("c1", "shows__summarise", {"text": "a long play"})),
        Reply.text("Prince avenges father, dies."),
        Reply.text("Done."),
    )
    sdk = {"command": sys.executable, "args": [str(SDK_SERVER)], "sampling": {}}
    settings = {
        "base_dir": tmp_path,
        "mcp": {"servers": {"shows": sdk}},
        "agents": {"test": {"model": model, "servers": ["shows"]}},
    }
    async with worker_harness(client, Settings.model_validate(settings), fake=fake_model) as h:
        result = await h.run("summarise it", agent="test")
    assert tool_result(result).text == "summary: Prince avenges father, dies."
    sampled = fake_model.requests("sdk-sampler")[1].body
    assert sampled["system"] == "Answer in five words."
    assert json.dumps(sampled["messages"]).count("Summarise: a long play") == 1


# -- durability ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_worker_killed_while_an_elicitation_waits(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    """The turn waits on an elicitation with no activity running; its worker process is
    SIGKILLed; a new worker (and a new server process) takes the answer and runs the call."""
    record = tmp_path / "record.txt"
    task_queue = f"elicit-{uuid.uuid4().hex[:10]}"
    asking = server(record, elicitation={"timeout": 3600})
    asking["env"][FLEET_ENV] = f"${{{FLEET_ENV}:}}"
    settings = {"task_queue": task_queue, **config(record)}
    settings["mcp"]["servers"]["shows"] = asking
    path = write_config(tmp_path / "turnkeep.yaml", settings)
    with WorkerProcesses(path, temporal.address, tmp_path / "logs") as workers:
        first = await workers.start_polling(client, task_queue)
        turn = await start_turn(
            client, TurnInput(agent="test", messages=[BOOK]), task_queue=task_queue
        )
        pending = await asked(turn)
        workers.kill(first)
        await workers.start_polling(client, task_queue)
        # Replayed by the new worker to the same wait: nothing was lost with the old one.
        again = await eventually(lambda: _waiting(turn), "the elicitation still waits")
        assert [p.call_id for p in again] == [pending.call_id]
        await turn.answer_elicitation(pending.call_id, {"name": "Cy", "seats": 3}, by="cy")
        result = await asyncio.wait_for(turn.result(), 60)
    assert tool_result(result).text == "booked 3 seats for Cy at Hamlet"
    assert runs(record)[0] == "book Hamlet asking" and runs(record)[-1] == "book Hamlet answered"


async def _waiting(turn: TurnHandle) -> list[PendingCall] | None:
    try:
        return await turn.pending_approvals() or None
    except RPCError:
        return None
