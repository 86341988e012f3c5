"""Determinism guard for the kinds of wait beside approval: a budget, an MCP server's elicitation
and sampling, a client-side tool's result. Each scenario runs fresh on the dev server, then that
history and the one recorded beside ``tests.test_replay``'s (``HISTORIES``) replay against the
current workflow code. Refresh them as that module says: run this one with
``TURNKEEP_RECORD_HISTORIES=1``."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from tests.conftest import HarnessFactory, eventually
from tests.test_client_tools import _agent, pick_once
from tests.test_costs import TOOLS, budget_wait, tool_then_text
from tests.test_costs import config as budget_config
from tests.test_elicitation import BOOK, asked, server, tool_result
from tests.test_elicitation import config as asking_config
from tests.test_replay import replays_fresh_and_recorded
from turnkeep.config.settings import Settings
from turnkeep.contract.messages import StopReason
from turnkeep.testing import harness as worker_harness
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.testing.fake_model import FakeModel

pytestmark = pytest.mark.asyncio


async def test_budget_replays_fresh_and_recorded(
    harness: HarnessFactory, fake: FakeModelApi
) -> None:
    """A tool round spends past the budget: the next model call waits at it until a person
    raises it, and the turn ends."""
    tool_then_text(fake)
    async with harness(TOOLS, **budget_config(fake, budget={"tokens": 100})) as h:
        turn = await h.start("go")
        await budget_wait(turn)
        await turn.raise_budget(500, by="tester")
        result = await turn.result()
        fresh = await turn.handle.fetch_history()
    assert result.stop_reason == StopReason.END_TURN and result.budget_raised == 400
    await replays_fresh_and_recorded("budget", fresh)


async def test_elicitation_replays_fresh_and_recorded(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    """A tool's server asks for a form: the call suspends, a person answers, the tool runs
    again with the answer."""
    record = tmp_path / "record.txt"
    async with harness(**asking_config(record, elicitation={"mode": "forms"})) as h:
        turn = await h.start(BOOK)
        pending = await asked(turn)
        assert pending.kind == "elicitation"
        await turn.answer_elicitation(pending.call_id, {"name": "Ann", "seats": 2}, by="tester")
        result = await turn.result()
        fresh = await turn.handle.fetch_history()
    assert tool_result(result).text == "booked 2 seats for Ann at Hamlet"
    await replays_fresh_and_recorded("elicitation", fresh)


async def test_sampling_replays_fresh_and_recorded(
    client: Client, fake_model: FakeModel, tmp_path: Path
) -> None:
    """A tool's server asks the model for a summary: the request waits for approval, is
    approved, runs on the agent's model, and the tool runs again with its answer."""
    model = fake_model.script(
        "sampler",
        Reply.tool_calls(("c1", "shows__summarise", {"text": "a long play"})),
        Reply.text("Prince avenges father, dies."),
        Reply.text("Done."),
    )
    settings = {
        "base_dir": tmp_path,
        "mcp": {"servers": {"shows": server(tmp_path / "record.txt", sampling={"approval": True})}},
        "agents": {"test": {"model": model, "servers": ["shows"]}},
    }
    async with worker_harness(client, Settings.model_validate(settings), fake=fake_model) as h:
        turn = await h.start("summarise it", agent="test")
        pending = await asked(turn)
        assert pending.kind == "sampling"
        await turn.decide(pending.call_id, True, by="tester")
        result = await turn.result()
        fresh = await turn.handle.fetch_history()
    assert tool_result(result).text == "summary: Prince avenges father, dies."
    await replays_fresh_and_recorded("sampling", fresh)


async def test_client_tool_replays_fresh_and_recorded(
    client: Client, fake_model: FakeModel
) -> None:
    """A call of a client-side tool waits for its client, which submits the result."""
    pick_once(fake_model)
    async with worker_harness(client, agents=[_agent(fake_model)], fake=fake_model) as h:
        turn = await h.start("pick a color", agent="app")
        [pending] = await eventually(turn.pending_approvals, "the call waits for its client")
        assert pending.kind == "client_result"
        await turn.submit_tool_result(pending.call_id, {"color": "red"}, by="tester")
        result = await turn.result()
        fresh = await turn.handle.fetch_history()
    assert result.final is not None and result.final.text == "Red it is."
    await replays_fresh_and_recorded("client_tool", fresh)
