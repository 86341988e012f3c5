"""How a turn's workflow history grows with its length: K iterations, each a model call and a
tool call returning 5 KB, next to the conversation itself.

The conversation is recorded once (the turn input, then each model reply and tool result as an
activity result), so history should grow like the conversation plus a fixed cost per event.
The fixed cost is measured on the floor: the bytes per event of a bare workflow of no-op
activities, whose events carry no payload at all.

A 200-iteration turn must finish without a history-size warning: neither the server's ("history
size exceeds warn limit", "Blob data size exceeds the warning limit", in its log) nor anything
near what triggers them (10 MB or 10,240 events per run, 512 KB per payload).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import EventType

from bench.environment import FLOOR, TURNS, Environment
from bench.floor import FloorInput
from bench.report import Table, progress
from bench.turns import Agent, conversation_bytes, count, run_floor, run_turn, runs_of

SERVER_WARNINGS = ("exceeds warn limit", "exceeds the warning limit")
HISTORY_WARN_BYTES = 10 * 1024 * 1024
HISTORY_WARN_EVENTS = 10_240
BLOB_WARN_BYTES = 512 * 1024
# Target: history ≤ 1.5 × the conversation + a fixed cost per event.
TARGET_FACTOR = 1.5
TARGET_K = 100


@dataclass(frozen=True)
class Growth:
    iterations: int
    runs: int
    events: int
    workflow_tasks: int
    history_bytes: int
    largest_event_bytes: int
    largest_run_bytes: int
    largest_run_events: int
    stored_bytes: int  # payloads written to external storage by this turn
    conversation_bytes: int
    server_warnings: list[str]

    def allowance(self, per_event: float) -> float:
        return TARGET_FACTOR * self.conversation_bytes + per_event * self.events

    @property
    def warned(self) -> bool:
        return bool(self.server_warnings) or (
            self.largest_run_bytes > HISTORY_WARN_BYTES
            or self.largest_run_events > HISTORY_WARN_EVENTS
            or self.largest_event_bytes > BLOB_WARN_BYTES
        )


def _stored(directory: Path) -> dict[Path, int]:
    if not directory.exists():
        return {}
    return {p: p.stat().st_size for p in directory.rglob("*") if p.is_file()}


async def floor_bytes_per_event(env: Environment) -> float:
    _, workflow_id = await run_floor(env.plain, FLOOR, FloorInput(40))
    (events,) = await runs_of(env.plain, workflow_id)
    return sum(e.ByteSize() for e in events) / len(events)


async def grow(env: Environment, iterations: int) -> Growth:
    before = _stored(env.payloads)
    log_offset = env.server_log.stat().st_size if env.server_log.exists() else 0
    turn = await run_turn(env.client, TURNS, Agent(iterations))
    runs = await runs_of(env.client, turn.workflow_id, turn.first_run_id)
    after = _stored(env.payloads)
    with env.server_log.open("rb") as log:
        log.seek(log_offset)
        new_lines = log.read().decode("utf-8", errors="replace").splitlines()
    warnings = [
        line.strip()
        for line in new_lines
        if any(w in line for w in SERVER_WARNINGS) and turn.workflow_id in line
    ]
    events = [e for run in runs for e in run]
    return Growth(
        iterations=iterations,
        runs=len(runs),
        events=len(events),
        workflow_tasks=count(events, EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),
        history_bytes=sum(e.ByteSize() for e in events),
        largest_event_bytes=max(e.ByteSize() for e in events),
        largest_run_bytes=max(sum(e.ByteSize() for e in run) for run in runs),
        largest_run_events=max(len(run) for run in runs),
        stored_bytes=sum(size for path, size in after.items() if path not in before),
        conversation_bytes=conversation_bytes(turn.result),
        server_warnings=warnings,
    )


async def history_growth(
    env: Environment, iterations: list[int]
) -> tuple[Table, list[Growth], float]:
    per_event = await floor_bytes_per_event(env)
    results = []
    for k in iterations:
        progress(f"history growth: K={k}")
        results.append(await grow(env, k))
    table = Table(
        "Workflow history of a turn of K iterations (tool results of 5 KB)",
        [
            "K",
            "runs",
            "events",
            "history KB",
            "stored KB",
            "conversation KB",
            "history ÷ conversation",
            f"≤ {TARGET_FACTOR}× conv. + {per_event:.0f} B/event",
        ],
    )
    for g in results:
        table.add(
            g.iterations,
            g.runs,
            f"{g.events:,}",
            f"{g.history_bytes / 1024:,.1f}",
            f"{g.stored_bytes / 1024:,.1f}",
            f"{g.conversation_bytes / 1024:,.1f}",
            f"{g.history_bytes / g.conversation_bytes:.2f}",
            "yes" if g.history_bytes <= g.allowance(per_event) else "no",
        )
    table.notes.append(
        "history: the bytes of every event of every run (continue-as-new included); stored: "
        "payloads the turn wrote to external payload storage instead (a reference to each is "
        f"in the history); conversation: the turn's result history as JSON. {per_event:.0f} "
        "B/event is the floor's (a bare workflow's events, no payloads), measured in this run."
    )
    return table, results, per_event
