"""Priority and fairness (issue #48): an agent's `priority`, lowered (never raised) by a turn's
input, a gateway key and a calling turn; a tenant as the fairness key; both resolved by
``prepare_turn`` into the plan and carried by every activity and child workflow a turn
schedules, as Temporal's task priority, which the dev server honours: queued batch work waits
for an interactive turn's. On the real dev server, with the passthrough model."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from a2a.types.a2a_pb2 import TaskState
from pydantic import ValidationError
from temporalio.api.common.v1 import Priority as PriorityProto
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import Priority

from tests.conftest import Harness, HarnessFactory, eventually, make_settings, turn_setup
from tests.test_a2a import a2a_client, final_task
from tests.test_a2a import send as a2a_send
from tests.test_a2a import user as a2a_user
from tests.test_cli_errors import cli, config, one_error
from tests.test_gateway import bearer, served
from tests.test_mcp_gateway import mcp_as, text
from tests.test_visibility import current_details
from turnkeep.client.history import read_turn
from turnkeep.client.turns import TurnHandle
from turnkeep.config.settings import Settings
from turnkeep.contract.activity_io import PrepareTurnRequest
from turnkeep.contract.turn_io import TaskPriority, TurnInput, TurnOverrides, lowest_priority
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.doors.a2a import session_id_for
from turnkeep.doors.gateway import gateway_app
from turnkeep.doors.gateway.auth import KeyRing, KeysFileError
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.testing import harness as worker_harness
from turnkeep.workflows.task_priority import temporal_priority

gate = asyncio.Event()
holding: list[str] = []


async def hold(name: str) -> str:
    """Holds the worker's only activity slot until the test opens the gate."""
    holding.append(name)
    await gate.wait()
    return f"{name} released"


@pytest.fixture(autouse=True)
def _reset() -> None:
    gate.clear()
    holding.clear()


# -- the rules, without a server ----------------------------------------------------------------


def test_the_lowest_priority_wins_and_none_has_no_say() -> None:
    assert lowest_priority("interactive", "batch") == "batch"
    assert lowest_priority("batch", "interactive") == "batch"
    assert lowest_priority("interactive", None) == "interactive"
    assert lowest_priority(None, "normal", "interactive") == "normal"
    assert lowest_priority() == "normal"


def test_the_temporal_mapping_leaves_an_unprioritised_turn_as_it_was() -> None:
    assert temporal_priority("normal", None) is Priority.default
    assert temporal_priority("interactive", None) == Priority(priority_key=1)
    assert temporal_priority("normal", "acme") == Priority(priority_key=3, fairness_key="acme")
    assert temporal_priority("batch", "acme") == Priority(priority_key=5, fairness_key="acme")


@pytest.mark.parametrize(
    ("agent", "asked", "effective"),
    [
        ("normal", None, "normal"),
        ("interactive", None, "interactive"),
        ("interactive", "batch", "batch"),
        ("batch", "interactive", "batch"),  # a turn lowers, never raises
        ("normal", "interactive", "normal"),
    ],
)
def test_prepare_turn_lowers_the_agents_priority_never_raises_it(
    tmp_path: Path, agent: TaskPriority, asked: TaskPriority | None, effective: str
) -> None:
    settings = make_settings(
        tmp_path,
        agents={
            "a": {"model": "passthrough", "priority": agent},
            "team": {"type": "chain", "sequence": ["a"], "priority": agent},
        },
    )
    setup = turn_setup(settings)
    for name in ("a", "team"):  # a model's turn and a workflow agent's alike
        request = PrepareTurnRequest(
            agent=name, overrides=TurnOverrides(), priority=asked, tenant="acme"
        )
        plan = setup.plan(request)
        assert (plan.priority, plan.fairness_key) == (effective, "acme")
    plain = setup.plan(PrepareTurnRequest(agent="a", overrides=TurnOverrides()))
    assert plain.fairness_key is None


def test_bad_priorities_and_tenants_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="'interactive', 'normal' or 'batch'"):
        make_settings(tmp_path, agents={"a": {"model": "passthrough", "priority": "urgent"}})
    with pytest.raises(ValidationError, match="'interactive', 'normal' or 'batch'"):
        TurnInput(agent="a", messages=["hi"], priority="urgent")  # type: ignore[arg-type]
    for tenant in ("", "has space", "x" * 65, "émile", "a/b"):
        with pytest.raises(ValidationError, match="tenant"):
            TurnInput(agent="a", messages=["hi"], tenant=tenant)
    TurnInput(agent="a", messages=["hi"], tenant="acme.eu-1:team@x")
    # A gateway key's tenant is its name unless it says; a name that cannot be one is named.
    key = {"key": "k" * 32, "agents": ["*"]}
    ring = KeyRing.from_settings(make_settings(tmp_path, gateway={"keys": {"ci": key}}))
    assert ring.keys[0].tenant == "ci" and ring.keys[0].priority is None
    # A keys file's names are free: one that cannot be a tenant is named.
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"my key": key}), encoding="utf-8")
    with pytest.raises(KeysFileError, match="give it a `tenant`"):
        KeyRing.from_settings(make_settings(tmp_path, gateway={"keys_file": str(keys_file)}))
    keys_file.write_text(
        json.dumps({"my key": {**key, "tenant": "mine", "priority": "batch"}}), encoding="utf-8"
    )
    [ours] = KeyRing.from_settings(make_settings(tmp_path, gateway={"keys_file": "keys.json"})).keys
    assert (ours.tenant, ours.priority) == ("mine", "batch")
    # A request may lower its key's priority, never raise it.
    assert ours.priority_of("interactive") == "batch"
    assert ring.keys[0].priority_of(None) is None
    assert ring.keys[0].priority_of("batch") == "batch"


# -- what a turn schedules ---------------------------------------------------------------------


def _pair(priority: PriorityProto) -> tuple[int, str]:
    return priority.priority_key, priority.fairness_key


async def scheduled(client: Client, workflow_id: str) -> list[tuple[str, int, str]]:
    """What the workflow scheduled and started, in order: each activity's and child
    workflow's name, priority key and fairness key (0 and "": Temporal's default)."""
    found: list[tuple[str, int, str]] = []
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = event.activity_task_scheduled_event_attributes
            found.append((a.activity_type.name, *_pair(a.priority)))
        elif event.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            c = event.start_child_workflow_execution_initiated_event_attributes
            found.append((c.workflow_id, *_pair(c.priority)))
    return found


TEAM: dict[str, Any] = {
    "pmo": {"model": "passthrough", "agents": ["ny"], "priority": "interactive"},
    # Called by a batch turn, an interactive agent runs at batch: never raised.
    "ny": {"model": "passthrough", "priority": "interactive"},
    "plain": {"model": "passthrough"},
    "steps": {"type": "chain", "sequence": ["ny"]},
}


async def test_a_turn_its_agent_call_and_a_session_turn_carry_the_priority(
    client: Client, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, agents=TEAM)
    async with worker_harness(client, settings, default_agent="pmo") as h:
        call = '***CALL_TOOL agent__ny {"message": "status"}'
        turn = await h.start(call, priority="batch", tenant="acme")
        await turn.result()
        parent = await scheduled(client, turn.workflow_id)
        assert parent[0] == ("prepare_turn", 5, "acme")
        assert {(a, k) for _, a, k in parent} == {(5, "acme")}
        [child_id] = [name for name, *_ in parent if name.startswith(turn.workflow_id)]
        child = await scheduled(client, child_id)
        assert child and {(a, k) for _, a, k in child} == {(5, "acme")}
        started = await client.get_workflow_handle(child_id).fetch_history_events().__anext__()
        inherited = TurnInput.model_validate(
            json.loads(started.workflow_execution_started_event_attributes.input.payloads[0].data)
        )
        assert (inherited.priority, inherited.tenant) == ("batch", "acme")
        # What `turnkeep show` and the Web UI's details say of it.
        view = await read_turn(client, child_id)
        assert (view.priority, view.tenant) == ("batch", "acme")
        assert "· priority: batch · tenant: `acme`" in await current_details(turn)

        # A team's step, likewise.
        team = await h.start("go", agent="steps", priority="batch", tenant="acme")
        await team.result()
        by_team = await scheduled(client, team.workflow_id)
        assert {(a, k) for _, a, k in by_team} == {(5, "acme")}
        [step] = [name for name, *_ in by_team if name.startswith(team.workflow_id)]
        assert {(a, k) for _, a, k in await scheduled(client, step)} == {(5, "acme")}

        # An unprioritised turn schedules what it did before priorities existed.
        plain = await h.start("hello", agent="plain")
        await plain.result()
        assert {(a, k) for _, a, k in await scheduled(client, plain.workflow_id)} == {(0, "")}
        view = await read_turn(client, plain.workflow_id)
        assert (view.priority, view.tenant) == (None, None)
        assert "priority" not in await current_details(plain)

        # A session's turns: its priority and tenant, the agent's lowered by them.
        session = await h.session(agent="ny", priority="normal", tenant="globex")
        await session.send("hi")
        await eventually(lambda: session_turn_done(session.handle), "the session's turn ended")
        [(turn_id, *session_turn)] = await scheduled(client, session.session_id)
        assert tuple(session_turn) == (3, "globex")
        assert {(a, k) for _, a, k in await scheduled(client, turn_id)} == {(3, "globex")}
        await session.close()


async def session_turn_done(handle: Any) -> bool:
    history = await handle.fetch_history()
    return any(
        e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED
        for e in history.events
    )


# -- the gateway -------------------------------------------------------------------------------

BATCH_KEY = "gw-batch-key-0123456789abcdef"
PLAIN_KEY = "gw-plain-key-0123456789abcdef"
INTERACTIVE = {"agents": {"test": {"model": "passthrough", "priority": "interactive"}}}
KEYS = {
    "bulk": {"key": BATCH_KEY, "agents": ["*"], "priority": "batch", "tenant": "acme"},
    "plain": {"key": PLAIN_KEY, "agents": ["*"]},
}


async def started_input(client: Client, workflow_id: str) -> dict[str, Any]:
    first = await client.get_workflow_handle(workflow_id).fetch_history_events().__anext__()
    payload = first.workflow_execution_started_event_attributes.input.payloads[0]
    data: dict[str, Any] = json.loads(payload.data)
    return data


async def test_the_gateway_sets_the_keys_priority_and_tenant_whatever_the_body_says(
    harness: HarnessFactory,
) -> None:
    async with harness(**INTERACTIVE) as h, gateway(h) as http:

        async def post(path: str, key: str, **body: Any) -> httpx2.Response:
            return await http.post(path, json={"agent": "test", **body}, headers=bearer(key))

        # A body asking for more than its key gets its key's.
        answer = await post("/api/turns", BATCH_KEY, prompt="hi", priority="interactive")
        assert answer.status_code == 201, answer.text
        turn_id = answer.json()["turn_id"]
        got = await started_input(h.client, turn_id)
        assert (got["priority"], got["tenant"]) == ("batch", "acme")
        await h.client.get_workflow_handle(turn_id).result()
        assert {(a, k) for _, a, k in await scheduled(h.client, turn_id)} == {(5, "acme")}
        # A key with neither: the body's priority, the key's name as the tenant.
        answer = await post("/api/turns", PLAIN_KEY, prompt="hi", priority="batch")
        got = await started_input(h.client, answer.json()["turn_id"])
        assert (got["priority"], got["tenant"]) == ("batch", "plain")
        answer = await post("/api/turns", PLAIN_KEY, prompt="hi")
        got = await started_input(h.client, answer.json()["turn_id"])
        assert "priority" not in got and got["tenant"] == "plain"
        # A session: the same.
        answer = await post("/api/sessions", BATCH_KEY, priority="interactive")
        assert answer.status_code == 201, answer.text
        got = await started_input(h.client, answer.json()["session_id"])
        assert (got["priority"], got["tenant"]) == ("batch", "acme")
        # What a request cannot say.
        answer = await post("/api/turns", PLAIN_KEY, prompt="hi", priority="urgent")
        assert answer.status_code == 422
        assert answer.json()["error"].startswith("priority: Input should be 'interactive'")
        answer = await post("/api/turns", PLAIN_KEY, prompt="hi", tenant="globex")
        assert answer.status_code == 422 and "tenant: Extra inputs" in answer.json()["error"]
        answer = await post("/api/sessions", PLAIN_KEY, priority="urgent")
        assert answer.status_code == 422


async def test_the_gateways_mcp_door_sets_the_keys_priority_and_tenant(
    harness: HarnessFactory,
) -> None:
    async with harness(**INTERACTIVE) as h:
        app = gateway_app(h.client, keyed(h), task_queue=h.task_queue, web=None, a2a=False)
        server = AsgiServer(app, name="gateway")
        async with app.router.lifespan_context(app):
            url = f"{http_url('127.0.0.1', await server.start(bind('127.0.0.1', 0)))}/mcp"
            try:
                async with mcp_as(url, BATCH_KEY) as mcp:
                    started = await mcp.call_tool(
                        "turnkeep_start", {"agent": "test", "message": "hi"}
                    )
                    answered = await mcp.call_tool("test", {"message": "hi"})  # a session's
            finally:
                await server.stop()
    assert not started.is_error and not answered.is_error, (started, answered)
    turn_id = json.loads(text(started))["turn_id"]
    got = await started_input(h.client, turn_id)
    assert (got["priority"], got["tenant"]) == ("batch", "acme")
    sessions = [
        w.id
        async for w in h.client.list_workflows(
            f"TaskQueue = '{h.task_queue}' AND WorkflowType = 'SessionWorkflow'"
        )
    ]
    for session in sessions:
        got = await started_input(h.client, session)
        assert (got["priority"], got["tenant"]) == ("batch", "acme")
    assert sessions


async def test_the_gateways_a2a_door_sets_the_keys_priority_and_tenant(
    harness: HarnessFactory,
) -> None:
    tasks = {}
    async with harness(**INTERACTIVE) as h:
        async with gateway(h) as http:  # A2A at /a2a/<agent>/
            for key in (BATCH_KEY, PLAIN_KEY):
                async with a2a_client(
                    str(http.base_url).rstrip("/"), streaming=False, key=key
                ) as a2a:
                    tasks[key] = final_task(await a2a_send(a2a, a2a_user("hi")))
        for key, task in tasks.items():
            assert task.status.state == TaskState.TASK_STATE_COMPLETED, (key, task.status)
        session = session_id_for("test", tasks[BATCH_KEY].context_id)
        got = await started_input(h.client, session)
        assert (got["priority"], got["tenant"]) == ("batch", "acme")
        assert (await read_turn(h.client, f"{session}/turn-1")).priority == "batch"
        # A key with neither: the agent's priority, the key's name as the tenant.
        got = await started_input(h.client, session_id_for("test", tasks[PLAIN_KEY].context_id))
        assert "priority" not in got and got["tenant"] == "plain"


def keyed(h: Harness) -> Settings:
    """The harness's settings with ``KEYS`` as the gateway's."""
    return h.settings.model_copy(
        update={"gateway": type(h.settings.gateway).model_validate({"keys": KEYS})}
    )


def gateway(h: Harness) -> Any:
    return served(gateway_app(h.client, keyed(h), task_queue=h.task_queue))


# -- the dev server honours it -----------------------------------------------------------------


async def first_started(client: Client, workflow_id: str) -> dict[str, float]:
    """When each kind of activity of the workflow first started (server time, seconds)."""
    scheduled_as: dict[int, str] = {}
    started: dict[str, float] = {}
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled_as[event.event_id] = (
                event.activity_task_scheduled_event_attributes.activity_type.name
            )
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            name = scheduled_as[event.activity_task_started_event_attributes.scheduled_event_id]
            started.setdefault(name, event.event_time.ToDatetime().timestamp())
    return started


async def pending(client: Client, workflow_id: str) -> bool:
    described = await client.get_workflow_handle(workflow_id).describe()
    return bool(described.raw_description.pending_activities)


@contextlib.asynccontextmanager
async def one_held_slot(client: Client, tmp_path: Path) -> AsyncIterator[Harness]:
    """A worker whose only activity slot a turn holds until ``gate`` opens: what the test
    starts meanwhile waits in the server's backlog, and is served in the server's order."""
    settings = make_settings(
        tmp_path,
        agents={
            "holder": {"model": "passthrough", "servers": ["local"]},
            "test": {"model": "passthrough", "priority": "interactive"},
        },
    )
    async with worker_harness(
        client,
        settings,
        function_tools={"local": [hold]},
        # Taken only through the task queue: an eager start would skip the backlog.
        max_concurrent_activities=1,
        disable_eager_activity_execution=True,
    ) as h:
        holder = await h.start('***CALL_TOOL local__hold {"name": "slot"}', agent="holder")
        await eventually(lambda: holding, "the slot held")
        yield h
        gate.set()
        await holder.result()


async def queued(h: Harness, prompt: str, **turn: Any) -> TurnHandle:
    """A turn of ``test`` started, once its set-up waits in the backlog."""
    started = await h.start(prompt, agent="test", **turn)
    await eventually(lambda: pending(h.client, started.workflow_id), "set-up queued")
    return started


async def started_in_order(h: Harness, turns: list[TurnHandle]) -> list[dict[str, float]]:
    """Open the gate, and when each turn's activities first started, once all have ended."""
    gate.set()
    for turn in turns:
        await turn.result()
    return [await first_started(h.client, turn.workflow_id) for turn in turns]


async def test_queued_batch_work_waits_for_an_interactive_turns(
    client: Client, tmp_path: Path
) -> None:
    async with one_held_slot(client, tmp_path) as h:
        batch = [await queued(h, f"batch {i}", priority="batch") for i in range(3)]
        interactive = await queued(h, "now")
        first, *others = await started_in_order(h, [interactive, *batch])
    # Queued after every batch turn's, the interactive turn's set-up went first...
    assert all(first["prepare_turn"] < b["prepare_turn"] for b in others), (first, others)
    # ...and its model call before any batch turn's.
    assert all(first["llm_step"] < b["llm_step"] for b in others), (first, others)


async def test_one_tenants_burst_does_not_hold_another_tenants_turn_behind_it(
    client: Client, tmp_path: Path
) -> None:
    async with one_held_slot(client, tmp_path) as h:
        burst = [await queued(h, f"a {i}", priority="batch", tenant="acme") for i in range(4)]
        other = await queued(h, "b", priority="batch", tenant="globex")
        *bursts, theirs = await started_in_order(h, [*burst, other])
    # Queued last, the other tenant's set-up went in the first two, not after all four.
    earlier = sorted(b["prepare_turn"] for b in bursts)
    assert theirs["prepare_turn"] < earlier[1], (theirs, bursts)


# -- the command line --------------------------------------------------------------------------


@pytest.mark.slow
async def test_run_takes_a_priority_and_a_tenant_and_refuses_bad_ones(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    config(tmp_path, priority="interactive")
    urgent, spaced, done = await asyncio.gather(
        cli(temporal, tmp_path, "run", "hi", "--priority", "urgent"),
        cli(temporal, tmp_path, "run", "hi", "--tenant", "a b"),
        cli(
            temporal,
            tmp_path,
            "run",
            "hi",
            "--priority",
            "batch",
            "--tenant",
            "acme",
            "--json",
            "--worker",
        ),
    )
    assert "--priority" in one_error(urgent) and "'urgent'" in one_error(urgent)
    assert one_error(spaced).startswith("error: invalid value for --tenant: String should match")
    assert done.returncode == 0, done.stderr
    view = await read_turn(client, json.loads(done.stdout)["turn_id"])
    assert (view.priority, view.tenant) == ("batch", "acme")
