"""A session whose followers long-poll while its turns end, then replayed from its history.

A session upserts its search attributes when a child turn starts and ends; a follower's
``wait_for_messages`` is an update, accepted in whichever workflow task it arrives. When both
land in one task, the SDK runs the update's validator (and records its acceptance) before the
workflow code that the task's other events wake, so the history says: acceptance, then upsert.
A history that says the opposite cannot replay on this code ("Update machine does not handle
this event: UpsertWorkflowSearchAttributes"), and a session that leaves its worker's cache would
be stuck. These tests make the two coincide many times, on a worker that keeps the session
cached and on one that keeps nothing (every task replays the whole history first, as after a
restart), and check the order each task recorded and that every history replays.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

from tests.conftest import make_settings
from turnkeep import open_session
from turnkeep.client.sessions import SessionHandle
from turnkeep.contract.session_io import SessionProgress
from turnkeep.testing import ReplayFailedError, check_replay
from turnkeep.testing import harness as worker_harness

pytestmark = pytest.mark.asyncio

AGENT = {"test": {"model": "passthrough"}}
UPSERT = EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
ACCEPTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
TASK_FAILED = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
_NOT_COMMANDS = (
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
)


def tasks_commands(history: WorkflowHistory) -> list[list[int]]:
    """Per completed workflow task, the indices (in ``history.events``) of the events its
    commands recorded, in order."""
    tasks: list[list[int]] = []
    for index, event in enumerate(history.events):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            tasks.append([])
        elif tasks and event.event_type not in _NOT_COMMANDS and event.event_type != TASK_FAILED:
            tasks[-1].append(index)
    return tasks


def both_in_one_task(history: WorkflowHistory) -> list[list[int]]:
    """The tasks that recorded an upsert and an update's acceptance."""
    types = [e.event_type for e in history.events]
    return [
        task for task in tasks_commands(history) if {UPSERT, ACCEPTED} <= {types[i] for i in task}
    ]


def upsert_before_acceptance(history: WorkflowHistory) -> list[int]:
    """Event ids of upserts recorded, in one task, before an update's acceptance."""
    types = [e.event_type for e in history.events]
    found = []
    for task in both_in_one_task(history):
        kinds = [types[i] for i in task]
        first_upsert, last_accepted = (
            kinds.index(UPSERT),
            len(kinds) - 1 - kinds[::-1].index(ACCEPTED),
        )
        if first_upsert < last_accepted:
            found.append(history.events[task[first_upsert]].event_id)
    return found


async def followed_session(client: Client, task_queue: str, turns: int) -> list[WorkflowHistory]:
    """A session of ``turns`` turns, followed throughout by long-polls that come back at once
    (so one is in flight whenever a turn starts or ends), by long-polls that wait for news, and
    by ``stream()``; its history and its turns'."""
    session = await open_session(client, agent="test", task_queue=task_queue)
    stop = asyncio.Event()

    async def poll(*, at_once: bool) -> None:
        after, seen = 0, None
        while not stop.is_set():
            progress: SessionProgress = await session.handle.execute_update(
                "wait_for_messages", args=[after, seen], result_type=SessionProgress
            )
            if at_once:
                # A turn id that never runs: answered in the task that accepts it.
                after, seen = 0, "not-a-turn"
            else:
                after = progress.count
                seen = progress.turn.workflow_id if progress.turn else None

    async def stream(handle: SessionHandle) -> None:
        async for _ in handle.stream():
            if stop.is_set():
                return

    followers = [
        asyncio.create_task(poll(at_once=True)),
        asyncio.create_task(poll(at_once=True)),
        asyncio.create_task(poll(at_once=False)),
        asyncio.create_task(stream(session)),
    ]
    try:
        for n in range(turns):
            sent = await session.send(f"message {n}")
            async for _ in session.messages(2 * n, until_turn=sent.turn):
                pass
    finally:
        stop.set()
        await session.close()
        await session.result()
        # A follower still polling when the session closes ends with an error: not the point.
        await asyncio.gather(*followers, return_exceptions=True)
    histories = [await session.handle.fetch_history()]
    for n in range(1, turns + 1):
        turn = client.get_workflow_handle(f"{session.session_id}/turn-{n}")
        histories.append(await turn.fetch_history())
    return histories


async def check_followed(client: Client, tmp_path: Path, turns: int, **worker: Any) -> None:
    settings = make_settings(tmp_path, agents=AGENT)
    async with worker_harness(client, settings, **worker) as h:
        histories = await followed_session(client, h.task_queue, turns)
    session = histories[0]
    # The case this is about happened (the session's first turn alone makes it likely).
    assert both_in_one_task(session), "no task had both an upsert and an acceptance"
    for history in histories:
        assert not upsert_before_acceptance(history), history.workflow_id
        assert not any(e.event_type == TASK_FAILED for e in history.events), history.workflow_id
    await check_replay(histories)


async def test_a_followed_session_replays(client: Client, tmp_path: Path) -> None:
    await check_followed(client, tmp_path, turns=10)


@pytest.mark.slow
async def test_a_followed_session_replays_on_a_worker_without_cache(
    client: Client, tmp_path: Path
) -> None:
    """Each workflow task on a worker without cache replays the history so far first: any
    order the code would not record again fails that task."""
    await check_followed(client, tmp_path, turns=4, max_cached_workflows=0)


async def test_an_upsert_recorded_before_an_acceptance_does_not_replay(
    client: Client, tmp_path: Path
) -> None:
    """The failure a history recorded in the other order meets: the same history with the
    upsert moved before the acceptance of its task fails to replay with the reported error."""
    settings = make_settings(tmp_path, agents=AGENT)
    async with worker_harness(client, settings) as h:
        [session, *_] = await followed_session(client, h.task_queue, turns=3)
    await check_replay([session])
    data = session.to_json_dict()
    events: list[dict[str, Any]] = data["events"]
    types = [e.event_type for e in session.events]
    task = both_in_one_task(session)[0]
    accepted = next(i for i in task if types[i] == ACCEPTED)
    upsert = next(i for i in task if types[i] == UPSERT)
    assert accepted < upsert  # as this code records it
    events.insert(accepted, events.pop(upsert))
    for index in range(accepted, upsert + 1):
        events[index]["eventId"] = str(int(events[index - 1]["eventId"]) + 1)
    reordered = WorkflowHistory.from_json(session.workflow_id, json.dumps(data))
    with pytest.raises(ReplayFailedError) as failed:
        await check_replay([reordered])
    assert "Update machine does not handle this event" in str(failed.value)
    assert "UpsertWorkflowSearchAttributes" in str(failed.value)
