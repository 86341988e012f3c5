"""An evaluation from history survives its worker: SIGKILLed mid-batch, the evaluation goes on
on the next worker from where its history says it was, and no recorded turn is replayed
twice."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from tests.worker_process import WorkerProcesses, write_config
from turnkeep.client.evaluations import evaluate
from turnkeep.client.turns import start_turn
from turnkeep.contract.turn_io import TurnInput, agent_task_queue
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing.environment import eventually

# Worker processes of its own, killed on purpose: slow, and marked so.
pytestmark = [pytest.mark.asyncio, pytest.mark.server, pytest.mark.slow]

FAST_RECOVERY = {"start_to_close": 60, "heartbeat": 2, "max_attempts": 5}
TURNS = 6


async def test_an_evaluation_survives_a_killed_worker(
    client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    task_queue = f"evals-{uuid.uuid4().hex[:10]}"
    agent = f"ev-{uuid.uuid4().hex[:8]}"
    config = write_config(
        tmp_path / "turnkeep.yaml",
        {
            "task_queue": task_queue,
            "agents": {
                agent: {
                    "model": "passthrough",
                    "llm_timeouts": FAST_RECOVERY,
                    "tool_timeouts": FAST_RECOVERY,
                }
            },
            "judges": ["tests.eval_judges:slow_judge"],
        },
    )
    with WorkerProcesses(config, temporal.address, tmp_path / "logs") as workers:
        first = await workers.start_polling(client, task_queue)
        sources = []
        for i in range(TURNS):
            turn = TurnInput(agent=agent, messages=[f"question {i}"])
            handle = await start_turn(client, turn, task_queue=agent_task_queue(task_queue, agent))
            await handle.result()
            sources.append(handle.workflow_id)
        query = f"TurnkeepAgent = '{agent}'"

        async def listed() -> bool:
            return (await client.count_workflows(query)).count >= TURNS

        await eventually(listed, "visibility lists the recorded turns")
        evaluation = await evaluate(
            client,
            query,
            judge="tests.eval_judges:slow_judge",
            concurrency=2,
            task_queue=task_queue,
        )

        async def some_done() -> bool:
            progress = await evaluation.progress()
            return 1 <= progress.summary.done < TURNS

        await eventually(some_done, "the batch is under way")
        workers.kill(first)
        await workers.start_polling(client, task_queue)
        report = await evaluation.report()

    assert report.finished and sorted(r.source for r in report.rows) == sorted(sources)
    assert all(r.status == "replayed" and r.same_final and r.score == 1.0 for r in report.rows)
    # Each recorded turn was replayed once: one run of each replay's id, no replay more.
    replays = [
        e.id
        async for e in client.list_workflows(
            f"TurnkeepReplayOf IS NOT NULL AND TurnkeepAgent = '{agent}'"
        )
    ]
    assert sorted(replays) == sorted(r.replay for r in report.rows)
