"""Benchmark: how fast a turn recovers from a SIGKILLed worker (not a test).

    .venv/bin/python -m bench.recovery [--runs 3] [--heartbeats 2,10] [--tool-seconds 3]

Everything runs in one go on a freshly started embedded dev server, with ``turnkeep worker``
processes (``tests.worker_process``) on one task queue. Each line is one way of dying:

- ``tool``: a turn's tool call (a stdio MCP tool that takes ``--tool-seconds``) is running when
  the worker running it is SIGKILLed;
- ``model``: a turn's model call (the fake Anthropic API on loopback, holding its answer) is
  in flight when the worker making it is SIGKILLed;

with the agent's ``heartbeat`` timeout (``llm_timeouts`` / ``tool_timeouts``) as given, and
with a ``standby`` worker already polling (any deployment with more than one worker) or none
(``cold``: the only worker died and a fresh process is started at once, so its start-up counts).
A replacement worker is started right after every kill. Reported, as the median over
``--runs`` kills, in seconds from the SIGKILL:

- ``retry started``: Temporal noticed the dead worker (missed heartbeats) and a live worker
  started the call's next attempt;
- ``progress``: the interrupted call completed on a live worker: the turn moves on (for a tool
  this includes the tool's own run time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client

from bench import report
from bench.turns import until, until_true
from tests.worker_process import WorkerProcesses, effects_server, write_config
from turnkeep.client.connection import connect
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.activity_io import CALL_TOOL, LLM_STEP
from turnkeep.contract.turn_io import TurnInput
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.testing.fake_api import FakeModelApi, Reply

T = TypeVar("T")
ACTIVITY = {"tool": CALL_TOOL, "model": LLM_STEP}


@dataclass(frozen=True)
class Case:
    during: Literal["tool", "model"]
    heartbeat: float
    standby: bool


def config(
    tmp: Path, queue: str, case: Case, tool_seconds: float, fake: FakeModelApi, payloads: Path
) -> Path:
    script = tmp / f"script-{queue}.json"
    call = {"name": "effects__effect", "arguments": {"tag": "t", "seconds": tool_seconds}}
    script.write_text(json.dumps([{"tool_calls": {"c1": call}}, "done"]), encoding="utf-8")
    timeouts = {"start_to_close": 120, "heartbeat": case.heartbeat, "max_attempts": 5}
    limits = {"llm_timeouts": timeouts, "tool_timeouts": timeouts}
    agents = {
        "tool": {"model": "playback", "playback": str(script), "servers": ["effects"], **limits},
        "model": {"model": "anthropic.bench", **limits},
    }
    return write_config(
        tmp / f"turnkeep-{queue}.yaml",
        {
            "task_queue": queue,
            "payload_storage": {"path": str(payloads)},  # the bench client's
            "mcp": {"servers": {"effects": effects_server(tmp / "record.jsonl")}},
            "anthropic": {"api_key": "sk-bench", "base_url": fake.base_url_anthropic},
            "agents": agents,
        },
    )


def tool_runs(record: Path, workflow_id: str | None = None) -> list[dict[str, Any]]:
    """Executions of the tool for one turn (or for all turns), in order."""
    if not record.exists():
        return []
    lines = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    return [
        e
        for e in lines
        if e["event"] == "start" and (workflow_id is None or e["key"] == f"{workflow_id}/c1")
    ]


async def running_on(turn: TurnHandle, activity_type: str) -> int | None:
    """The pid of the worker running the first attempt of ``activity_type``, once it runs."""
    description = await turn.handle.describe()
    for pending in description.raw_description.pending_activities:
        if (
            pending.activity_type.name == activity_type
            and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            and pending.last_worker_identity
        ):
            return int(pending.last_worker_identity.split("@")[0])
    return None


async def retry_started(turn: TurnHandle, activity_type: str) -> float | None:
    """When a later attempt of ``activity_type`` started (epoch seconds), once one has."""
    description = await turn.handle.describe()
    for pending in description.raw_description.pending_activities:
        if (
            pending.activity_type.name == activity_type
            and pending.attempt >= 2
            and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        ):
            return float(pending.last_started_time.ToDatetime().timestamp())
    return None


async def completed(client: Client, workflow_id: str, activity_type: str) -> float | None:
    """When the first ``activity_type`` activity of the turn completed (epoch seconds)."""
    scheduled: set[int] = set()
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == activity_type:
                scheduled.add(event.event_id)
        elif (
            kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and event.activity_task_completed_event_attributes.scheduled_event_id in scheduled
        ):
            return float(event.event_time.ToDatetime().timestamp())
    return None


class Bench:
    def __init__(self, client: Client, tmp: Path, fake: FakeModelApi, tool_seconds: float):
        self.client = client
        self.tmp = tmp
        self.fake = fake
        self.tool_seconds = tool_seconds
        self.record = tmp / "record.jsonl"

    async def turn(self, queue: str, agent: str) -> TurnHandle:
        return await start_turn(
            self.client, TurnInput(agent=agent, messages=["go"]), task_queue=queue
        )

    async def warm_up(self, workers: WorkerProcesses, queue: str) -> None:
        """Tool turns until every running worker has run the tool once: a worker opens its
        stdio MCP server on first use, and that start-up is not what a standby line measures."""
        for _ in range(20):
            if set(workers.running) <= {e["worker"] for e in tool_runs(self.record)}:
                return
            await (await self.turn(queue, "tool")).result()

    async def kill_once(
        self, case: Case, workers: WorkerProcesses, queue: str
    ) -> tuple[float, float]:
        while len(workers.running) < (2 if case.standby else 1):
            await workers.start_polling(self.client, queue)
        if case.standby and case.during == "tool":
            await self.warm_up(workers, queue)
        activity_type = ACTIVITY[case.during]
        if case.during == "model":
            # The first request hangs until its worker dies; the retry is answered at once.
            self.fake.script(Reply.delay(300, then=Reply.text("done")), api="anthropic")
        turn = await self.turn(queue, case.during)
        if case.during == "tool":

            async def runner() -> int | None:
                runs = tool_runs(self.record, turn.workflow_id)
                return int(runs[0]["worker"]) if runs else None

            victim = await until(runner, "the tool to start")
        else:
            await until_true(lambda: self.fake.pending("anthropic") == 0, "the model call")
            victim = await until(lambda: running_on(turn, activity_type), "the model call to start")
        workers.kill(victim)
        killed_at = workers.killed[victim]
        workers.start()  # the replacement (with a standby up, the retry need not wait for it)
        retried = await until(lambda: retry_started(turn, activity_type), "the retry")
        done = await until(
            lambda: completed(self.client, turn.workflow_id, activity_type), "the retry to complete"
        )
        await turn.result()
        return retried - killed_at, done - killed_at


@dataclass(frozen=True)
class Recovery:
    case: Case
    retry_started: float  # median seconds from the SIGKILL
    progress: float


def cases(heartbeats: list[float], cold: bool = True) -> list[Case]:
    chosen = [Case(during, h, True) for h in heartbeats for during in ("tool", "model")]
    if cold:
        chosen += [Case("tool", heartbeats[0], False), Case("model", heartbeats[0], False)]
    return chosen


async def measure(
    client: Client,
    info: ServerInfo,
    fake: FakeModelApi,
    tmp: Path,
    payloads: Path,
    chosen: list[Case],
    runs: int,
    tool_seconds: float,
) -> list[Recovery]:
    """Each case, ``runs`` kills each, against the server at ``info``; ``client`` must store
    payloads in ``payloads`` (the workers are configured with it)."""
    bench = Bench(client, tmp, fake, tool_seconds)
    results = []
    for case in chosen:
        report.progress(f"recovery: {case.during}, heartbeat {case.heartbeat:g} s, {_kind(case)}")
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        cfg = config(bench.tmp, queue, case, tool_seconds, fake, payloads)
        logs = bench.tmp / f"logs-{queue}"
        with WorkerProcesses(cfg, info.address, logs, info.namespace) as workers:
            samples = [await bench.kill_once(case, workers, queue) for _ in range(runs)]
        results.append(
            Recovery(
                case,
                statistics.median(s[0] for s in samples),
                statistics.median(s[1] for s in samples),
            )
        )
    return results


def _kind(case: Case) -> str:
    return "standby" if case.standby else "cold"


def table(results: list[Recovery], runs: int, tool_seconds: float) -> report.Table:
    out = report.Table(
        "Recovery: seconds from a worker's SIGKILL",
        ["during", "heartbeat", "other worker", "retry started", "progress"],
    )
    for r in results:
        out.add(
            r.case.during,
            f"{r.case.heartbeat:g} s",
            _kind(r.case),
            f"{r.retry_started:.1f}",
            f"{r.progress:.1f}",
        )
    out.notes.append(
        f"Median of {runs} kill(s) per line. *retry started*: a live worker started the "
        "interrupted call's next attempt; *progress*: that attempt completed, so the turn moves "
        f"on (a tool's includes its own {tool_seconds:g} s). *standby*: a second worker was "
        "already polling; *cold*: a new worker process is started after the kill."
    )
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--heartbeats", default="2,10", help="heartbeat timeouts in seconds")
    parser.add_argument("--tool-seconds", type=float, default=3.0)
    args = parser.parse_args()
    heartbeats = [float(h) for h in args.heartbeats.split(",")]

    # Answers any request beyond the script (a retry of a retry) so no run ends in an error.
    with (
        FakeModelApi(default=Reply.text("done")) as fake,
        tempfile.TemporaryDirectory(prefix="turnkeep-bench-") as name,
    ):
        tmp = Path(name)
        storage = Settings.model_validate({"payload_storage": {"path": str(tmp / "payloads")}})
        async with EmbeddedServer(ui=False) as info:
            client = await connect(info.address, info.namespace, settings=storage)
            results = await measure(
                client,
                info,
                fake,
                tmp,
                tmp / "payloads",
                cases(heartbeats),
                args.runs,
                args.tool_seconds,
            )
    print(table(results, args.runs, args.tool_seconds).render())


if __name__ == "__main__":
    asyncio.run(main())
