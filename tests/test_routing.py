"""Which worker runs a turn: workers of different configs on one task queue each serve their
own agents' queues (``agent_task_queue``), where turnkeep's clients start turns and sessions,
so a turn never lands on a worker that lacks its agent. Against the real dev server, with
two workers whose agents do not overlap."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError

from tests.conftest import make_settings
from tests.worker_process import WorkerProcesses, write_config
from turnkeep.client.sessions import open_session
from turnkeep.client.turns import start_turn
from turnkeep.contract.turn_io import TurnInput, agent_task_queue
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.worker.build import build_workers

pytestmark = pytest.mark.asyncio

TURNS = 20
SESSION_TURNS = 5


async def test_turns_and_sessions_reach_the_workers_that_have_their_agent(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    # Two `turnkeep worker` processes on one task queue, with agents that do not overlap.
    queue = f"shared-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        for agent in ("alpha", "beta"):
            config = write_config(
                tmp_path / f"{agent}.yaml",
                {"task_queue": queue, "agents": {agent: {"model": "passthrough"}}},
            )
            workers = stack.enter_context(
                WorkerProcesses(config, temporal.address, tmp_path / f"{agent}-logs")
            )
            await workers.start_polling(client, agent_task_queue(queue, agent))

        async def turn(agent: str, n: int) -> str:
            handle = await start_turn(
                client,
                TurnInput(agent=agent, messages=[f"{agent} {n}"]),
                task_queue=agent_task_queue(queue, agent),
            )
            result = await handle.result()
            assert result.final is not None
            return result.final.text

        async def session(agent: str) -> list[str]:
            handle = await open_session(
                client, agent=agent, task_queue=agent_task_queue(queue, agent)
            )
            seen: list[str] = []
            for n in range(SESSION_TURNS):
                sent = await handle.send(f"{agent} session {n}")
                async for m in handle.messages(len(seen), until_turn=sent.turn):
                    seen.append(m.text if m.role == "assistant" else "")
            answers = [text for text in seen if text]
            await handle.close()
            return answers

        results = await asyncio.gather(
            *(turn(agent, n) for agent in ("alpha", "beta") for n in range(TURNS)),
            session("alpha"),
            session("beta"),
        )
    turns, sessions = results[: 2 * TURNS], results[2 * TURNS :]
    # The passthrough model echoes the prompt: each turn was answered, by its own agent.
    assert turns == [f"{a} {n}" for a in ("alpha", "beta") for n in range(TURNS)]
    assert sessions == [
        [f"{a} session {n}" for n in range(SESSION_TURNS)] for a in ("alpha", "beta")
    ]


async def test_a_turn_on_the_shared_queue_that_meets_the_wrong_worker_says_where_to_go(
    client: Client, tmp_path: Path
) -> None:
    """The shared queue still serves turns (for workers that all have the same agents); one
    that reaches a worker without its agent fails with the queue to start it on."""
    queue = f"shared-{uuid.uuid4().hex[:8]}"
    alpha = make_settings(tmp_path, task_queue=queue, agents={"alpha": {"model": "passthrough"}})
    async with build_workers(client, alpha) as workers:
        assert workers.task_queues == [queue, f"{queue}.alpha"]
        handle = await start_turn(
            client, TurnInput(agent="beta", messages=["hi"]), task_queue=queue
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    text = str(failed.value.cause.cause) if failed.value.cause else ""
    assert "Unknown agent 'beta'" in text
    assert f"task queue '{queue}.beta'" in text


async def test_clients_start_on_the_agents_queue_by_default(client: Client, tmp_path: Path) -> None:
    """``start_turn`` and ``open_session`` without a task queue: the agent's queue on
    turnkeep's default task queue, which `turnkeep worker` serves with default settings."""
    settings = make_settings(tmp_path, agents={"solo": {"model": "passthrough"}})
    async with build_workers(client, settings) as workers:
        assert workers.task_queues == ["turnkeep", "turnkeep.solo"]
        handle = await start_turn(client, TurnInput(agent="solo", messages=["ping"]))
        assert (await handle.handle.describe()).task_queue == "turnkeep.solo"
        result = await handle.result()
        session = await open_session(client, agent="solo")
        assert (await session.handle.describe()).task_queue == "turnkeep.solo"
        await session.close()
    assert result.final is not None and result.final.text == "ping"
