"""A fork survives a killed worker: the worker running its first turn's model call is killed
(SIGKILL), and the fork's turn completes on another worker process, with the conversation it
was forked with. Real worker processes, the real dev server and the fake model API."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.worker_process import WorkerProcesses, write_config
from turnkeep import load_settings
from turnkeep.client.connection import connect
from turnkeep.client.sessions import SessionHandle, open_session
from turnkeep.client.turns import get_turn
from turnkeep.contract.turn_io import agent_task_queue
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing.fake_api import FakeModelApi, Reply

pytestmark = pytest.mark.asyncio

AGENT = "fragile"


@pytest.fixture
def fake() -> Iterator[FakeModelApi]:
    with FakeModelApi() as provider:
        yield provider


async def answered(session: SessionHandle, start: int, turn: int) -> list[str]:
    return [m.text async for m in session.messages(start, until_turn=turn)]


async def test_a_fork_completes_on_a_new_worker_after_its_first_turns_worker_dies(
    temporal: ServerInfo, fake: FakeModelApi, tmp_path: Path
) -> None:
    task_queue = f"fork-durable-{uuid.uuid4().hex[:8]}"
    config = write_config(
        tmp_path / "turnkeep.yaml",
        {
            "task_queue": task_queue,
            "agents": {
                AGENT: {
                    "model": "anthropic.test-model",
                    # A dead worker's call is retried after 2 s without a heartbeat.
                    "llm_timeouts": {"start_to_close": 60, "heartbeat": 2, "max_attempts": 3},
                }
            },
            "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        },
    )
    # The client shares the workers' payload storage: the fork goes on from the source's
    # stored conversation by reference.
    client = await connect(temporal.address, temporal.namespace, settings=load_settings(config))
    queue = agent_task_queue(task_queue, AGENT)
    with WorkerProcesses(config, temporal.address, tmp_path / "logs") as workers:
        first = await workers.start_polling(client, task_queue)
        fake.script(Reply.text("first answer"), api="anthropic")
        source = await open_session(client, agent=AGENT, task_queue=queue)
        sent = await source.send("hello")
        assert await answered(source, 0, sent.turn) == ["hello", "first answer"]

        fake.reset()
        # The fork's first model call hangs until its worker dies; the retry is answered.
        fake.script(Reply.delay(300, then=Reply.text("forked")), Reply.text("forked"))
        forked = await source.fork(2, message="again", task_queue=queue)
        await eventually(lambda: len(fake.requests) == 1, "the fork's model call is in flight")
        workers.kill(first)
        await workers.start_polling(client, task_queue)
        try:
            texts = await asyncio.wait_for(answered(forked, 0, 1), 90)
        except TimeoutError:
            raise AssertionError(f"the fork's turn did not end:\n{workers.log_tail()}") from None
        assert texts == ["hello", "first answer", "again", "forked"]
        turn = await get_turn(client, f"{forked.session_id}/turn-1").result()
        assert [m.text for m in turn.history] == texts
        assert len(fake.requests) == 2  # the interrupted call was made again
        # The source is untouched.
        assert [m.text async for m in source.transcript()] == ["hello", "first answer"]
        for session in (source, forked):
            await session.close()
            await session.result()
