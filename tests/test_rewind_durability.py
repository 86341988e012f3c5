"""A rewound session, durably: a rewind survives its worker being SIGKILLed right after it
(the next message is answered from the rewound conversation by a new worker, which replays the
session's history, rewind included), and a recorded history of a rewound session replays
against the current workflow code (``tests/histories/session_rewind.json``)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.conftest import HarnessFactory, write_script
from tests.test_replay import replays_fresh_and_recorded
from tests.test_rewind import talk
from tests.worker_process import WorkerProcesses, write_config
from turnkeep import open_session
from turnkeep.client.turns import get_turn
from turnkeep.devserver.embedded import ServerInfo

pytestmark = pytest.mark.asyncio


async def test_a_rewind_survives_its_worker_being_killed(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    task_queue = f"rewind-{uuid.uuid4().hex[:10]}"
    config = {"task_queue": task_queue, "agents": {"test": {"model": "passthrough"}}}
    path = write_config(tmp_path / "turnkeep.yaml", config)
    with WorkerProcesses(path, temporal.address, tmp_path / "logs") as workers:
        first = await workers.start_polling(client, task_queue)
        session = await open_session(client, agent="test", task_queue=task_queue)
        await talk(session, "a", "b", "c")
        await session.rewind(1, by="alice")
        # Right after the rewind: the worker that took it dies with the session in its cache.
        workers.kill(first)
        await workers.start_polling(client, task_queue)
        try:
            turn = await asyncio.wait_for(talk(session, "d"), 120)
        except TimeoutError:
            raise AssertionError(f"the session did not go on:\n{workers.log_tail()}") from None
        result = await get_turn(client, f"{session.session_id}/turn-{turn}").result()
        rewinds = await session.rewinds()
        await session.close()
        await asyncio.wait_for(session.result(), 60)
    assert turn == 4
    assert [m.text for m in result.history] == ["a", "a", "d", "d"]
    assert [(r.from_turn, r.to_turn, r.by) for r in rewinds] == [(3, 1, "alice")]


async def test_a_rewound_session_replays_fresh_and_recorded(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    """A session's first run: two turns, a rewind to the first, a third turn, then it
    continues as new (the state it carries holds the rewind)."""
    path = write_script(tmp_path / "script.json", "One.", "Two.", "Three.", "Four.")
    agent = {"model": "playback", "playback": str(path)}
    # Its child turns' ids derive from its own: the recorded one replays under the same id.
    session_id = "replayed-rewound-session"
    async with harness(agents={"test": agent}) as h:
        session = await open_session(
            h.client, agent="test", task_queue=h.task_queue, session_id=session_id, turns_per_run=3
        )
        first_run = (await session.handle.describe()).run_id
        await talk(session, "message 1", "message 2")
        await session.rewind(1, by="replay-test")
        await talk(session, "message 3")
        await session.rewind(0, by="replay-test")  # in the next run, across the boundary
        await talk(session, "message 4")
        first = h.client.get_workflow_handle(session_id, run_id=first_run)
        fresh = await first.fetch_history()
        await session.close()
        await session.result()
    assert fresh.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    names = [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        for e in fresh.events
        if e.event_type == accepted
    ]
    assert "rewind" in names
    await replays_fresh_and_recorded("session_rewind", fresh, session_id)
