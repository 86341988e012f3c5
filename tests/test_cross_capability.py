"""One scenario that crosses every capability (issue 43), on the real dev server with a real
worker process, the real gateway over a socket, real stdio MCP servers and the fake model API:

- a session opened and driven through the gateway's HTTP API;
- its agent (``lead``) calls an agent as a tool (``clerk``), whose MCP tool needs approval,
  given through the gateway to the session's turn (the parent) and taken by the child;
- an everyday FastMCP server (``ctx.elicit``) asks the user during ``lead``'s tool call,
  answered through the gateway;
- the session's budget (tokens, ``per: session``) holds its second turn before its model
  call, raised through the gateway;
- the worker process is SIGKILLed twice, while the child's call waits for approval and while
  the elicitation waits, and a new one started each time.

The kills are where turnkeep promises that nothing runs again: a turn waiting on a person has
no activity in flight, so the worker that dies holds nothing of it. What the test asserts:
every answer is the scripted one, every model call was made once, the approval-gated tool ran
once (by the worker that got the approval), the asking tool made its side effect once, the
session's event stream (followed across both kills, which the gateway's feed rides out) has
every message once and in order, and every decision is recorded with the gateway key that
made it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
from temporalio.client import Client

from tests.conftest import eventually
from tests.test_agent_tools_durability import history, scheduled
from tests.test_durability import TOOL, executions
from tests.test_gateway import bearer, events, messages, served
from tests.worker_process import FLEET_ENV, WorkerProcesses, effects_server, write_config
from turnkeep.activities.tools import idempotency_key
from turnkeep.config.files import load_settings
from turnkeep.contract.turn_io import agent_task_queue
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.doors.gateway import gateway_app
from turnkeep.testing.fake_api import FakeModelApi, Reply, Tokens
from turnkeep.workflows.agent_tools import child_id

# A worker process of its own, killed on purpose: slow, and marked so.
pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

GREETER = Path(__file__).parent / "mcp_servers" / "greeting_server.py"
KEY = "desk-key-0123456789abcdef"  # every agent, may decide
BY = "gateway key desk"
BUDGET_TOKENS = 1000
RAISED_TO = 100_000
WITHIN = 90.0  # seconds any one step of the scenario may take, a worker's restart included
# No kill here lands mid-activity, so nothing needs a dead worker's call retried soon; a
# heartbeat missed on a loaded machine would retry a call for real, which is not this test's
# subject.
PATIENT = {"heartbeat": 60}

# What the models answer, in order. The lead's last answer of turn 1 reports enough tokens to
# spend the session's budget, so that turn 2 waits before its first model call.
LEAD = [
    Reply.tool_calls(("a1", "agent__clerk", {"message": "Put Ada in the ledger."})),
    Reply.tool_calls(("g1", "greeter__greet", {"guest": "Ada"})),
    Reply.text("Ada is in the ledger, and Ann welcomed her.", usage=Tokens(input=1500, output=500)),
    Reply.text("Nothing else: Ada is all set."),
]
CLERK = [
    Reply.tool_calls(("k1", TOOL, {"tag": "ledger"})),
    Reply.text("Ada is in the ledger."),
]


def scenario_config(directory: Path, task_queue: str, fake: FakeModelApi) -> Path:
    agents = {
        "lead": {
            "model": "anthropic.lead",
            "agents": ["clerk"],
            "servers": ["greeter"],
            "budget": {"tokens": BUDGET_TOKENS, "per": "session", "timeout": "1h"},
            "llm_timeouts": PATIENT,
            "tool_timeouts": PATIENT,
        },
        "clerk": {
            "model": "anthropic.clerk",
            "servers": ["effects"],
            "approval": {"tools": ["effects__*"], "timeout": "1h"},
            "llm_timeouts": PATIENT,
            "tool_timeouts": PATIENT,
        },
    }
    greeter = {
        "command": sys.executable,
        "args": [str(GREETER)],
        # The fleet's marker, expanded by the worker: the test's clean-up finds the server.
        "env": {
            "TURNKEEP_TEST_RECORD": str(directory / "greetings.jsonl"),
            FLEET_ENV: f"${{{FLEET_ENV}:}}",
        },
        "elicitation": {"timeout": 3600},
    }
    config = {
        "task_queue": task_queue,
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "mcp": {
            "servers": {"effects": effects_server(directory / "ledger.jsonl"), "greeter": greeter}
        },
        "agents": agents,
        "gateway": {"keys": {"desk": {"key": KEY, "agents": ["*"], "decide": True}}},
    }
    return write_config(directory / "turnkeep.yaml", config)


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


class Desk:
    """The scenario's side of the gateway: one key that may decide, and the worker fleet."""

    def __init__(
        self, http: httpx2.AsyncClient, client: Client, workers: WorkerProcesses, queue: str
    ) -> None:
        self.http = http
        self.client = client
        self.workers = workers
        self.queues = [agent_task_queue(queue, "lead"), agent_task_queue(queue, "clerk")]
        self.tasks: list[asyncio.Future[Any]] = []  # cancelled if the test ends before them

    async def __aenter__(self) -> Desk:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def serve(self) -> int:
        """A new worker process, once it polls both agents' queues."""
        pid = self.workers.start()
        for queue in self.queues:
            await self.workers.wait_polling(self.client, queue, pid, within=WITHIN)
        return pid

    async def restart(self, pid: int) -> int:
        """SIGKILL worker ``pid`` and start another in its place."""
        self.workers.kill(pid)
        return await self.serve()

    async def call(self, method: str, path: str, **body: Any) -> Any:
        answer = await self.http.request(
            method, path, headers=bearer(KEY), **({"json": body} if body else {})
        )
        assert answer.status_code < 300, (method, path, answer.status_code, answer.text)
        return answer.json()

    async def waiting(self, turn_id: str, kind: str) -> dict[str, Any]:
        """The one call of ``kind`` waiting in turn ``turn_id`` (or its children), as the
        gateway lists it; asked until a worker answers (one may just have been started)."""

        async def probe() -> dict[str, Any] | None:
            answer = await self.http.get(
                f"/api/turns/{quote(turn_id, safe='')}/approvals", headers=bearer(KEY)
            )
            if answer.status_code != 200:  # no worker to answer the query yet
                return None
            calls = [c for c in answer.json()["approvals"] if c["kind"] == kind]
            return calls[0] if len(calls) == 1 else None

        return await self.until(probe, f"a call of kind {kind} waits in {turn_id}")

    async def decide(self, turn_id: str, call_id: str, **decision: Any) -> dict[str, Any]:
        path = f"/api/turns/{quote(turn_id, safe='')}/approvals/{quote(call_id, safe='')}"
        record: dict[str, Any] = await self.call("POST", path, approve=True, **decision)
        return record

    async def turn(self, turn_id: str) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            state: dict[str, Any] = await self.call("GET", f"/api/turns/{quote(turn_id, safe='')}")
            return state if state["status"] != "running" else None

        return await self.until(probe, f"turn {turn_id} ends")

    async def until(self, probe: Callable[[], Awaitable[Any]], what: str) -> Any:
        try:
            return await eventually(probe, what, within=WITHIN)
        except AssertionError as err:
            raise AssertionError(f"{err}; worker logs:\n{self.workers.log_tail()}") from None


async def scheduled_by(client: Client, workflow_id: str) -> list[str]:
    return scheduled(await history(client, workflow_id))


def texts(message: dict[str, Any]) -> list[str]:
    return [block["text"] for block in message.get("content") or [] if block["type"] == "text"]


def tool_texts(result: dict[str, Any]) -> dict[str, str]:
    """Call id -> the text of its result, for every tool result of a turn."""
    return {
        call_id: "".join(b["text"] for b in r["content"] if b["type"] == "text")
        for m in result["messages"]
        for call_id, r in (m.get("tool_results") or {}).items()
    }


async def test_a_gateway_session_crosses_every_capability_through_two_worker_kills(
    client: Client, temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    fake.script(*LEAD, model="lead")
    fake.script(*CLERK, model="clerk")
    task_queue = f"scenario-{uuid.uuid4().hex[:10]}"
    config = scenario_config(tmp_path, task_queue, fake)
    settings = load_settings(config)
    with WorkerProcesses(config, temporal.address, tmp_path / "logs") as workers:
        async with (
            served(gateway_app(client, settings)) as http,
            Desk(http, client, workers, task_queue) as desk,
        ):
            first = await desk.serve()
            session = (await desk.call("POST", "/api/sessions", agent="lead"))["session_id"]
            base = f"/api/sessions/{session}"
            # Followed from the start, across both kills, until the session closes.
            stream = asyncio.ensure_future(events(http, f"{base}/events", KEY))
            desk.tasks.append(stream)

            # Turn 1: the lead asks the clerk; the clerk's tool waits for approval.
            sent = await desk.call("POST", f"{base}/messages", text="Check Ada in, please.")
            turn1 = sent["turn_id"]
            clerk = child_id(turn1, 1, "a1")
            approval = await desk.waiting(turn1, "approval")
            assert (approval["call_id"], approval["name"], approval["arguments"]) == (
                "k1",
                TOOL,
                {"tag": "ledger"},
            )
            assert (approval["turn_id"], approval["child_turn_id"]) == (turn1, clerk)
            # Kill 1: the child waits on a person, no activity in flight.
            second = await desk.restart(first)
            approval = await desk.waiting(turn1, "approval")  # replayed to the same wait
            assert not executions(tmp_path / "ledger.jsonl", clerk)
            approved = await desk.decide(turn1, "k1", reason="checked")

            # Then the lead's MCP tool asks who welcomes Ada.
            asked = await desk.waiting(turn1, "elicitation")
            assert asked["call_id"] == "g1:elicit:1" and asked["name"] == "greeter__greet"
            assert asked["prompt"] and "Who welcomes Ada?" in asked["prompt"]
            # Kill 2: the turn waits on a person, the tool call suspended, nothing in flight.
            third = await desk.restart(second)
            asked = await desk.waiting(turn1, "elicitation")
            [field] = (asked["requested_schema"] or {})["properties"]
            answered = await desk.decide(turn1, asked["call_id"], content={field: "Ann"})
            one = await desk.turn(turn1)

            # Turn 2: the session's budget is spent; the turn waits before its model call.
            sent = await desk.call("POST", f"{base}/messages", text="Anything else?")
            turn2 = sent["turn_id"]
            budget = await desk.waiting(turn2, "budget")
            # The lead's three calls (15 + 15 + 2,000 tokens) and the clerk's two (15 + 15):
            # what an agent called as a tool spends counts in the session's budget.
            assert budget["prompt"] == "spent 2,060 tokens of 1,000 tokens"
            raised = await desk.decide(turn2, budget["call_id"], limit=RAISED_TO)
            two = await desk.turn(turn2)

            await desk.call("POST", f"{base}/close")
            got = await asyncio.wait_for(stream, WITHIN)
            transcript = (await desk.call("GET", base))["messages"]

    # Every answer is the scripted one.
    assert one["status"] == "completed" and two["status"] == "completed"
    assert tool_texts(one["result"]) == {
        "a1": "Ada is in the ledger.",
        "g1": "Ann welcomed Ada",
    }
    assert texts(one["result"]["final"]) == ["Ada is in the ledger, and Ann welcomed her."]
    assert texts(two["result"]["final"]) == ["Nothing else: Ada is all set."]

    # Every decision is recorded, by the gateway key that made it.
    assert (approved["decision"], approved["by"], approved["call_id"]) == ("approve", BY, "k1")
    assert (answered["decision"], answered["by"]) == ("approve", BY)
    assert (raised["decision"], raised["by"]) == ("approve", BY)
    assert [(d["kind"], d["by"]) for d in one["result"]["decisions"]] == [("elicitation", BY)]
    assert [(d["kind"], d["by"]) for d in two["result"]["decisions"]] == [("budget", BY)]
    assert two["result"]["budget_raised"] == RAISED_TO - BUDGET_TOKENS

    # The session ran two turns; turn 1 started the clerk once and called each of its tools
    # once (the asking tool's call twice: suspended, then run again with the answer); no
    # activity was scheduled again after a kill.
    assert await scheduled_by(client, session) == [f"child {turn1}", f"child {turn2}"]
    assert await scheduled_by(client, turn1) == [
        *("prepare_turn", "list_tools", "llm_step", f"child {clerk}"),
        *("llm_step", "call_tool", "call_tool", "llm_step"),
    ]
    assert await scheduled_by(client, clerk) == [
        *("local prepare_turn", "list_tools", "llm_step", "call_tool", "llm_step"),
    ]
    assert await scheduled_by(client, turn2) == ["prepare_turn", "list_tools", "llm_step"]

    # Every model call was made once: none was made again after a kill.
    assert len(fake.requests_for_model("lead")) == len(LEAD)
    assert len(fake.requests_for_model("clerk")) == len(CLERK)

    # The approval-gated tool ran once, by the worker that took the approval.
    runs = executions(tmp_path / "ledger.jsonl", clerk)
    assert list(runs) == ["k1"]
    assert [(e["event"], e["worker"]) for e in runs["k1"]] == [
        ("start", second),
        ("applied", second),
        ("done", second),
    ]
    assert {e["key"] for e in runs["k1"]} == {idempotency_key(clerk, "k1")}

    # The asking tool made its side effect once. By design it runs again from its start with
    # the answer (docs/elicitation.md, "suspend and re-ask"): its first run, suspended, is
    # either told "cancel" (an older connection) or never hears back, and its result is set
    # aside; the run with the answer, in the worker started after the second kill, greets.
    greetings = lines(tmp_path / "greetings.jsonl")
    assert {e["key"] for e in greetings} == {idempotency_key(turn1, "g1")}
    assert [(e["guest"], e["host"], e["worker"]) for e in greetings if e["event"] == "greeted"] == [
        ("Ada", "Ann", third)
    ]
    actions = [e["action"] for e in greetings if e["event"] == "asked"]
    assert actions[-1] == "accept" and actions[:-1] in ([], ["cancel"])

    # Nothing lost: the session's stream, followed across both kills, has every message of
    # the transcript once and in order, then the session's end.
    streamed = messages(got)
    assert [m["index"] for m in streamed] == list(range(len(transcript)))
    assert [m["message"] for m in streamed] == transcript
    assert {m["turn_id"] for m in streamed} == {turn1, turn2}
    assert got[-1][:2] == ("end", {"status": "completed", "error": None})
