"""Provider limits (issue #48): a fleet against a provider that enforces requests and tokens
per minute, with turnkeep's ``limits:`` configured and without (not a test)::

    .venv/bin/python -m bench.limits [--quick]     # or: python -m bench --only limits

The fake OpenAI API (``turnkeep.testing.fake_api``) enforces 120 requests and 40,000 tokens
per minute over a sliding window of what it answers, and answers 429 with ``retry-after``
beyond them. Two ``turnkeep worker`` processes on one task queue take 300 batch turns and 20
interactive turns, all started together (the batch first); each turn is one model call. Each
call is sized so that both limits bind at once: its prompt is padded until prompt +
completion tokens come to tokens / requests per minute (333), as the fake counts them (its
JSON's characters / 4, plus 50 completion tokens).

Each side runs the same 20 interactive turns alone first (the idle fleet), and then the
loaded run. The ``limits:`` side configures ``limits: {openai.fleet: {requests_per_minute,
tokens_per_minute}}`` on the workers and ``priority: batch`` / ``interactive`` on the two
agents; the other side is the same config without ``limits:`` (today's behaviour: each
worker retries its own 429s after their ``retry-after``). A worker that does not know the
``limits:`` key yet leaves that side out, saying so. ``--quick`` divides the limits by 4 and
the turns by 10 (interactive: by 5), for a smoke run of ~4 min instead of ~8 (the side
without ``limits:`` alone: 1.5 and 2.5 min). A turn not done within 4× the time the limits
allow (at least 5 min) counts as failed and is terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client

from bench.report import Table, Target, progress, targets_table
from tests.worker_process import WorkerProcesses, write_config
from turnkeep.client.connection import connect
from turnkeep.client.turns import start_turn
from turnkeep.config.settings import AgentSettings, Settings
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import TurnInput
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.testing.fake_api import (
    FakeModelApi,
    LimitStats,
    ProviderLimits,
    Reply,
    Tokens,
    request_tokens,
)

MODEL = "openai.fleet"  # the limit's key: the model string as turnkeep resolves it
OUTPUT_TOKENS = 50  # completion tokens of every answer
MAX_TOKENS = 64  # the agents' max_tokens: what a limiter may estimate a call's output at
WORKERS = 2
WINDOW = 60.0  # a provider's minute, and a limiter's
# The targets of issue #48's table.
MAX_429_SHARE = 0.01
MIN_THROUGHPUT = 0.9
MAX_PEAK_TOKENS = 1.05
MAX_INTERACTIVE_P95 = 2.0
TARGETS = [
    "turns that fail: 0",
    f"model requests answered 429 ≤ {MAX_429_SHARE:.0%}",
    f"throughput ≥ {MIN_THROUGHPUT:.0%} of the limit",
    f"tokens per minute never over the limit by more than {MAX_PEAK_TOKENS - 1:.0%}",
    f"interactive turns' p95 ≤ {MAX_INTERACTIVE_P95:g}× the same turns' on an idle fleet",
]


@dataclass(frozen=True)
class Scale:
    requests_per_minute: int
    tokens_per_minute: int
    batch: int
    interactive: int

    @property
    def tokens_per_request(self) -> int:
        """Prompt + completion tokens a call must count for both limits to bind at once."""
        return self.tokens_per_minute // self.requests_per_minute

    @property
    def provider(self) -> ProviderLimits:
        return ProviderLimits(self.requests_per_minute, self.tokens_per_minute, WINDOW)


FULL = Scale(120, 40_000, 300, 20)
QUICK = Scale(30, 10_000, 30, 4)


@dataclass(frozen=True)
class Run:
    """One batch of turns started together, until the last one ended."""

    seconds: float
    failed: list[str]  # why, one per turn that failed or did not finish
    interactive: list[float]  # seconds from start to result, per interactive turn that ended
    batch: list[float]  # well, and per batch turn
    interactive_failed: int
    stats: LimitStats  # the fake provider's counts over the run

    @property
    def requests_per_minute(self) -> float:
        return self.stats.answered / self.seconds * 60

    @property
    def tokens_per_minute(self) -> float:
        return self.stats.tokens / self.seconds * 60


@dataclass(frozen=True)
class Side:
    limited: bool
    priority: bool  # whether the agents' priority was configured
    idle: Run | None = None
    loaded: Run | None = None
    skipped: str | None = None  # why the side did not run


def p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile (of 20 values: the 19th)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)] if ordered else math.nan


def config(
    scale: Scale, fake: FakeModelApi, queue: str, payloads: Path, *, limited: bool, priority: bool
) -> dict[str, Any]:
    """The workers' config: two agents of one model, with priorities and ``limits:`` or not."""

    def agent(kind: str) -> dict[str, Any]:
        return {
            "model": MODEL,
            "max_tokens": MAX_TOKENS,
            "compaction": {"enabled": False},
            **({"priority": kind} if priority else {}),
        }

    out: dict[str, Any] = {
        "task_queue": queue,
        "payload_storage": {"path": str(payloads)},  # the bench client's
        "openai": {"api_key": "sk-bench", "base_url": fake.base_url_openai},
        "agents": {"batch": agent("batch"), "interactive": agent("interactive")},
    }
    if limited:
        out["limits"] = {
            MODEL: {
                "requests_per_minute": scale.requests_per_minute,
                "tokens_per_minute": scale.tokens_per_minute,
            }
        }
    return out


def refused(worker_config: dict[str, Any]) -> str | None:
    """Why a worker would refuse this config (the keys of issue #48 it does not know yet), or
    None: the worker's own validation, run here before any process starts."""
    try:
        Settings.model_validate(worker_config)
    except ValidationError as err:
        return "; ".join(f"`{'.'.join(map(str, e['loc']))}`: {e['msg']}" for e in err.errors()[:3])
    return None


class TurnFailed(Exception):
    """A turn that ended, but not with the model's answer (its model call failed for good)."""


class Fleet:
    """The fake provider, the bench's client, and how one side's turns are run."""

    def __init__(self, client: Client, info: ServerInfo, tmp: Path, scale: Scale) -> None:
        self.client = client
        self.info = info
        self.tmp = tmp
        self.scale = scale
        self.payloads = tmp / "payloads"
        self.fake = FakeModelApi(
            default=Reply.text("done", usage=Tokens(output=OUTPUT_TOKENS, sized=True))
        )
        self.message = "x"

    @contextlib.asynccontextmanager
    async def workers(self, worker_config: dict[str, Any], name: str) -> AsyncIterator[str]:
        """``WORKERS`` worker processes of ``worker_config``, polling; yields their queue."""
        path = write_config(self.tmp / f"turnkeep-{name}.yaml", worker_config)
        queue = str(worker_config["task_queue"])
        with WorkerProcesses(path, self.info.address, self.tmp / f"logs-{name}") as workers:
            pids = [workers.start() for _ in range(WORKERS)]
            await asyncio.gather(*(workers.wait_polling(self.client, queue, p) for p in pids))
            yield queue

    async def size(self, queue: str) -> None:
        """Pad the turns' message so that a call counts ``tokens_per_request``: one turn with a
        one-character message tells what the rest of its request counts."""
        self.fake.limit(None)
        await self._turn(queue, "batch")
        base = request_tokens(self.fake.requests[-1].body)
        prompt = self.scale.tokens_per_request - OUTPUT_TOKENS
        # Each character more is a quarter of a token more, as the fake counts.
        self.message = "x" * (1 + max(prompt - base, 0) * 4)
        progress(f"limits: a call's request counts {base} tokens unpadded; padded to {prompt}")

    async def _turn(self, queue: str, agent: str, workflow_id: str | None = None) -> float:
        """Seconds from starting one turn to its result; raises if it did not end well."""
        started = time.monotonic()
        # Started at its agent's priority, as a batch job starts its turns (`--priority
        # batch`): the agent's own `priority:` governs from the turn's plan on, but the
        # turn's first workflow task and set-up run at the priority its start names.
        named = {"priority": agent} if "priority" in TurnInput.model_fields else {}
        handle = await start_turn(
            self.client,
            TurnInput(agent=agent, messages=[self.message], **named),
            task_queue=queue,
            workflow_id=workflow_id or f"limits-{agent}-{uuid.uuid4().hex[:12]}",
        )
        result = await handle.result()
        if result.stop_reason != StopReason.END_TURN:
            said = result.final.text if result.final is not None else ""
            raise TurnFailed(f"ended `{result.stop_reason}`: {said}"[:160])
        return time.monotonic() - started

    async def run(self, queue: str, batch: int, interactive: int) -> Run:
        """``batch`` then ``interactive`` turns started together, against the provider's limits
        counted afresh; until the last one ended (or a generous deadline passed)."""
        self.fake.limit(self.scale.provider)
        # The fastest a limit allows, 4× over: a turn not done by then is counted as failed.
        calls = batch + interactive
        deadline = max(4 * calls / self.scale.requests_per_minute * 60, 300.0)
        started = time.monotonic()
        agents = ["batch"] * batch + ["interactive"] * interactive
        ids = [f"limits-{agent}-{uuid.uuid4().hex[:12]}" for agent in agents]
        tasks = [
            asyncio.ensure_future(self._turn(queue, agent, workflow_id))
            for agent, workflow_id in zip(agents, ids, strict=True)
        ]
        _, pending = await asyncio.wait(tasks, timeout=deadline)
        for task in pending:
            task.cancel()
        # Turns still running past the deadline are ended, so none outlives its workers.
        for task, workflow_id in zip(tasks, ids, strict=True):
            if task in pending:
                with contextlib.suppress(Exception):
                    await self.client.get_workflow_handle(workflow_id).terminate("bench deadline")
        seconds = time.monotonic() - started
        failed = [f"not done within {deadline:.0f} s" for _ in pending]
        times: list[float | None] = []
        for task in tasks:
            if task in pending:
                times.append(None)
            elif (err := task.exception()) is not None:
                failed.append(str(err) if isinstance(err, TurnFailed) else repr(err))
                times.append(None)
            else:
                times.append(task.result())
        await asyncio.gather(*pending, return_exceptions=True)
        return Run(
            seconds,
            failed,
            interactive=[t for t in times[batch:] if t is not None],
            batch=[t for t in times[:batch] if t is not None],
            interactive_failed=times[batch:].count(None),
            stats=self.fake.limit_stats(),
        )

    async def side(self, *, limited: bool, first: bool) -> Side:
        priority = "priority" in AgentSettings.model_fields
        name = "limited" if limited else "unlimited"
        queue = f"bench-limits-{name}-{uuid.uuid4().hex[:6]}"
        worker_config = config(
            self.scale, self.fake, queue, self.payloads, limited=limited, priority=priority
        )
        if (why := refused(worker_config)) is not None:
            return Side(limited, priority, skipped=f"this worker refuses its config: {why}")
        async with self.workers(worker_config, name) as queue:
            if first:
                await self.size(queue)
            progress(f"limits: {name}: {self.scale.interactive} interactive turns, idle fleet")
            idle = await self.run(queue, 0, self.scale.interactive)
            if limited:
                # A limiter remembers the idle run's calls for a minute: the loaded run starts
                # against a window as empty as the provider's.
                await asyncio.sleep(WINDOW)
            progress(
                f"limits: {name}: {self.scale.batch} batch + {self.scale.interactive} "
                "interactive turns, started together"
            )
            loaded = await self.run(queue, self.scale.batch, self.scale.interactive)
        return Side(limited, priority, idle, loaded)


async def limits(
    client: Client, info: ServerInfo, tmp: Path, quick: bool
) -> tuple[Table, list[Target]]:
    scale = QUICK if quick else FULL
    fleet = Fleet(client, info, tmp, scale)
    with fleet.fake:
        limited = await fleet.side(limited=True, first=True)
        if limited.skipped is not None:
            progress(f"limits: the `limits:` side cannot run yet: {limited.skipped}")
        unlimited = await fleet.side(limited=False, first=limited.skipped is not None)
    return table(scale, limited, unlimited, fleet), targets(scale, limited)


def _failures(run: Run) -> str:
    if not run.failed:
        return "0"
    turns = len(run.batch) + len(run.interactive) + len(run.failed)
    first = run.failed[0]
    first = first if len(first) <= 72 else first[:71] + "…"
    return f"{len(run.failed)} of {turns} (the first: {first})"


def _rate_limited(run: Run) -> str:
    s = run.stats
    return f"{s.rate_limited} of {s.answered + s.rate_limited} ({s.rate_limited_share:.1%})"


def _throughput(run: Run, scale: Scale) -> str:
    return (
        f"{run.requests_per_minute:.0f} rpm "
        f"({run.requests_per_minute / scale.requests_per_minute:.0%}), "
        f"{run.tokens_per_minute:,.0f} tpm ({run.tokens_per_minute / scale.tokens_per_minute:.0%})"
    )


def _peak(run: Run, scale: Scale) -> str:
    s = run.stats
    return (
        f"{s.peak_tokens:,} tokens ({s.peak_tokens / scale.tokens_per_minute:.0%}), "
        f"{s.peak_requests} requests ({s.peak_requests / scale.requests_per_minute:.0%})"
    )


def _interactive(side: Side) -> str:
    assert side.idle is not None and side.loaded is not None
    loaded, idle = p95(side.loaded.interactive), p95(side.idle.interactive)
    failed = side.loaded.interactive_failed + side.idle.interactive_failed
    # Of the turns that ended well: a failed one has no completion to rank.
    also = f"; {failed} failed, not ranked" if failed else ""
    return f"{loaded:.1f} s against {idle:.1f} s idle ({loaded / idle:.2f}×{also})"


def _cells(side: Side, scale: Scale) -> list[str]:
    run = side.loaded
    assert run is not None
    batch = sorted(run.batch)
    return [
        _failures(run),
        _rate_limited(run),
        _throughput(run, scale),
        _peak(run, scale),
        _interactive(side),
        f"{run.seconds:.0f} s",
        f"{batch[len(batch) // 2]:.0f} s" if batch else "n/a",
    ]


def table(scale: Scale, limited: Side, unlimited: Side, fleet: Fleet) -> Table:
    sides = [s for s in (limited, unlimited) if s.skipped is None]
    names = {True: "`limits:` configured", False: "no `limits:`"}
    t = Table(
        f"Provider limits: {scale.batch} batch + {scale.interactive} interactive turns on "
        f"{WORKERS} worker processes, a provider at {scale.requests_per_minute} rpm / "
        f"{scale.tokens_per_minute:,} tpm",
        ["measure", "target", *(names[s.limited] for s in sides)],
    )
    labels = [
        ("turns that fail", "0"),
        ("model requests answered 429", f"≤ {MAX_429_SHARE:.0%}"),
        ("throughput (answered ÷ start to last turn done)", f"≥ {MIN_THROUGHPUT:.0%} of the limit"),
        ("peak in any 60 s window", f"≤ {MAX_PEAK_TOKENS:.0%} of the limit"),
        ("interactive turns' p95 completion", f"≤ {MAX_INTERACTIVE_P95:g}× idle"),
        ("the run (start → last turn done)", ""),
        ("batch turns' median completion", ""),
    ]
    columns = [_cells(side, scale) for side in sides]
    for i, (label, target) in enumerate(labels):
        t.add(label, target, *(cells[i] for cells in columns))
    t.notes.append(
        f"Each turn is one model call of the fake OpenAI API, sized to {scale.tokens_per_request} "
        f"tokens (the prompt padded to {scale.tokens_per_request - OUTPUT_TOKENS}, as the fake "
        f"counts it: its JSON's characters / 4; {OUTPUT_TOKENS} completion tokens), so that "
        "requests and tokens per minute bind together. The provider's 60 s window is a sliding "
        "one, so a fleet that bursts can pass 100 % of the rate over a short run. The idle "
        "fleet's figure is the same interactive turns alone on the same workers, just before. "
        "Both sides count afresh at the provider. Each turn is started with its agent's "
        "priority in its input (`TurnInput.priority`), as a batch job would start its turns: "
        "the agent's `priority:` alone governs from the turn's plan on, and its first workflow "
        "task and set-up would queue behind the batch turns started before it."
    )
    if not any(s.priority for s in (limited, unlimited)):
        t.notes.append("The agents' `priority:` is not configured: this worker does not know it.")
    for side in (limited, unlimited):
        if side.skipped is not None:
            t.notes.append(
                f"**The {names[side.limited]} side did not run**: {side.skipped}. It runs once "
                "issue #48's limiter is merged."
            )
    return t


def targets(scale: Scale, side: Side) -> list[Target]:
    """Issue #48's targets, read off the ``limits:`` side (not measured if it did not run)."""
    if side.skipped is not None or side.loaded is None or side.idle is None:
        return [Target(t, "the `limits:` side did not run", None) for t in TARGETS]
    run, idle = side.loaded, side.idle
    ratio = p95(run.interactive) / p95(idle.interactive)
    return [
        Target(TARGETS[0], str(len(run.failed)), not run.failed),
        Target(TARGETS[1], _rate_limited(run), run.stats.rate_limited_share <= MAX_429_SHARE),
        Target(
            TARGETS[2],
            _throughput(run, scale),
            max(
                run.requests_per_minute / scale.requests_per_minute,
                run.tokens_per_minute / scale.tokens_per_minute,
            )
            >= MIN_THROUGHPUT,
        ),
        Target(
            TARGETS[3],
            _peak(run, scale),
            run.stats.peak_tokens <= MAX_PEAK_TOKENS * scale.tokens_per_minute,
        ),
        Target(TARGETS[4], _interactive(side), ratio <= MAX_INTERACTIVE_P95),
    ]


async def _main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="turnkeep-bench-limits-") as name:
        tmp = Path(name)
        async with EmbeddedServer(ui=False, log_file=tmp / "temporal.log") as info:
            settings = Settings.model_validate(
                {"base_dir": str(tmp), "payload_storage": {"path": str(tmp / "payloads")}}
            )
            client = await connect(info.address, info.namespace, settings=settings)
            started = time.monotonic()
            t, measured = await limits(client, info, tmp, args.quick)
            print(t.render())
            print(targets_table(measured, "Targets (issue #48)").render())
            progress(f"limits: {(time.monotonic() - started) / 60:.1f} min")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="limits ÷ 4, turns ÷ 10")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
