"""turnkeep's benchmarks in one command (not tests: they print figures and assert nothing)::

    .venv/bin/python -m bench [--quick] [--only history,overhead,...]

Every figure but the dev-server flags comes from one run on one freshly started embedded dev
server, next to a floor measured in the same run (the machine may be shared and noisy: the
ratios are the point). Progress goes to stderr; stdout gets markdown tables, ending with the
targets of issue #7 and whether this run met them. The benchmarks' README explains each section.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import tempfile
import time
import traceback
from collections.abc import Awaitable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

from bench import (
    approvals,
    elicitations,
    forks,
    history,
    limits,
    overhead,
    peers_bench,
    recovery,
    replay,
    report,
    session_storage,
    sessions,
    teams,
    throughput,
)
from bench.environment import Environment, environment
from bench.gateway import gateway_bench
from bench.live_stream import live_stream
from bench.memory import worker_memory
from bench.report import Table, Target
from bench.server_flags import server_flags
from bench.turns import Agent
from turnkeep.testing.fake_api import FakeModelApi, Reply

SECTIONS = (
    "history",
    "overhead",
    "throughput",
    "recovery",
    "approvals",
    "elicitations",
    "sessions",
    "storage",
    "fork",
    "teams",
    "live",
    "gateway",
    "memory",
    "peers",
    "replay",
    "limits",
    "flags",
)
OVERHEAD_MAX = 1.2
OVERHEAD_TARGET = f"loop overhead ≤ {OVERHEAD_MAX}× floor ({overhead.K} iterations)"
THROUGHPUT_TARGET = f"throughput ≥ {throughput.TARGET}× floor"
HISTORY_TARGET = (
    f"history at K={history.TARGET_K} ≤ {history.TARGET_FACTOR}× conversation + the floor's "
    "bytes per event"
)
LONG_TURN_TARGET = "a 200-iteration turn: no history-size warning"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("::")[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer repeats and smaller batches (~4 min)"
    )
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    parser.add_argument("--iterations", help="history: K values (default 5,20,50,100,200)")
    parser.add_argument("--repeats", type=int, help="loop overhead: runs per variant")
    parser.add_argument("--memory-turns", type=int, help="worker memory: turns in flight")
    parser.add_argument("--recovery-runs", type=int, help="recovery: kills per line")
    parser.add_argument(
        "--approval-turns", type=int, help="approvals: turns awaiting approval at once"
    )
    parser.add_argument(
        "--elicitation-turns", type=int, help="elicitations: turns awaiting an elicitation at once"
    )
    parser.add_argument("--session-turns", type=int, help="sessions: turns of the long session")
    parser.add_argument("--idle-sessions", type=int, help="sessions: idle sessions on a worker")
    parser.add_argument(
        "--peer-iterations",
        help="peers: K values (default 20,100,400; --quick 20,100)",
    )
    parser.add_argument("--peer-rounds", type=int, help="peers: rounds (default 3)")
    parser.add_argument(
        "--peers",
        help="peers: the lines to run, comma-separated (turnkeep, pydantic-ai, openai-agents, "
        "fast-agent; default all)",
    )
    return parser


@dataclass
class Results:
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    # Issue #23's (approvals and sessions), in a table of their own.
    session_targets: list[Target] = field(default_factory=list)
    # Issue #33's (agents as tools), likewise.
    team_targets: list[Target] = field(default_factory=list)
    # Issue #48's (provider limits), likewise.
    limit_targets: list[Target] = field(default_factory=list)


# The targets each section checks, reported as not measured if it fails.
SECTION_TARGETS = {
    "history": [HISTORY_TARGET, LONG_TURN_TARGET],
    "overhead": [OVERHEAD_TARGET],
    "throughput": [THROUGHPUT_TARGET],
}
SECTION_TEAM_TARGETS = {"teams": teams.TARGETS}
SECTION_LIMIT_TARGETS = {"limits": limits.TARGETS}


def _overhead_measured(o: overhead.Overhead) -> str:
    """The ratio, with what it is made of: it moves with the floor's speed (a slow server makes
    the same extra cost a smaller share), so the absolute extra too, and how precisely the
    pairs pin it down (whether the target's line is inside that interval)."""
    pairs = o.ratios()
    low, high = report.median_interval(pairs)
    floor_ms = o.seconds(overhead.FLOOR_BARE) * 1000 / o.iterations
    extra_ms = o.extra(overhead.TURN) * 1000 / o.iterations
    return (
        f"{o.ratio():.2f}× (95% interval of the median {low:.2f}–{high:.2f}× over "
        f"{len(pairs)} pairs; "
        f"+{extra_ms:.1f} ms per iteration on a {floor_ms:.1f} ms floor)"
    )


async def _section(name: str, results: Results, work: Awaitable[None]) -> None:
    """Runs one section; if it fails, the others' figures are still printed."""
    try:
        await work
    except Exception as err:
        report.progress(f"{name} failed:\n{traceback.format_exc()}")
        results.failures.append(f"{name}: {type(err).__name__}: {err}")
        results.targets += [
            Target(t, "section failed", None) for t in SECTION_TARGETS.get(name, [])
        ]
        results.team_targets += [
            Target(t, "section failed", None) for t in SECTION_TEAM_TARGETS.get(name, [])
        ]
        results.limit_targets += [
            Target(t, "section failed", None) for t in SECTION_LIMIT_TARGETS.get(name, [])
        ]


async def run(args: argparse.Namespace) -> Results:
    only = set(args.only.split(","))
    if unknown := only - set(SECTIONS):
        raise SystemExit(f"unknown section(s) {sorted(unknown)}; choose from {SECTIONS}")
    quick = args.quick
    iterations = [int(k) for k in (args.iterations or "5,20,50,100,200").split(",")]
    repeats = args.repeats or (2 if quick else 15)
    memory_turns = args.memory_turns or (200 if quick else 1000)
    recovery_runs = args.recovery_runs or (1 if quick else 2)
    approval_turns = args.approval_turns or (200 if quick else 1000)
    elicitation_turns = args.elicitation_turns or (200 if quick else 1000)
    session_turns = args.session_turns or (200 if quick else 1000)
    idle_sessions = args.idle_sessions or (200 if quick else 1000)
    peer_iterations = [
        int(k)
        for k in (
            args.peer_iterations
            or ",".join(map(str, peers_bench.QUICK_ITERATIONS if quick else peers_bench.ITERATIONS))
        ).split(",")
    ]
    peer_rounds = args.peer_rounds or peers_bench.ROUNDS
    out = Results()
    agents = {Agent(k) for k in iterations} | {
        Agent(overhead.K),
        Agent(overhead.K, "line"),
        Agent(overhead.K, "blob_async"),
        Agent(throughput.ITERATIONS),
        replay.AGENT,
    }

    async def history_section(env: Environment) -> None:
        table, growth, per_event = await history.history_growth(env, iterations)
        out.tables.append(table)
        out.targets += _history_targets(growth, per_event)

    async def overhead_section(env: Environment) -> None:
        tables, result = await overhead.loop_overhead(env, repeats)
        out.tables += tables
        ratio = result.ratio()
        out.targets.append(
            Target(OVERHEAD_TARGET, _overhead_measured(result), ratio <= OVERHEAD_MAX)
        )

    async def throughput_section(env: Environment) -> None:
        table, tp = await throughput.throughput(env, 1 if quick else 6)
        out.tables.append(table)
        out.targets.append(
            Target(
                THROUGHPUT_TARGET,
                f"{tp.ratio:.2f}× (rounds {min(tp.ratios):.2f}–{max(tp.ratios):.2f}×)",
                tp.ratio >= throughput.TARGET,
            )
        )

    async def recovery_section(env: Environment) -> None:
        # Answers any retry beyond the script, so no kill ends in an error.
        with FakeModelApi(default=Reply.text("done")) as fake:
            cases = recovery.cases([2.0], cold=False)  # cold restarts: python -m bench.recovery
            results = await recovery.measure(
                env.client, env.info, fake, env.tmp, env.payloads, cases, recovery_runs, 3.0
            )
        out.tables.append(recovery.table(results, recovery_runs, 3.0))

    async def approvals_section(env: Environment) -> None:
        table, targets = await approvals.approvals(env, approval_turns, 20 if quick else 50)
        out.tables.append(table)
        out.session_targets += targets

    async def elicitations_section(env: Environment) -> None:
        table, targets = await elicitations.elicitations(
            env, elicitation_turns, 20 if quick else 50
        )
        out.tables.append(table)
        out.session_targets += targets

    async def sessions_section(env: Environment) -> None:
        tables, targets = await sessions.sessions(env, session_turns, idle_sessions)
        out.tables += tables
        out.session_targets += targets
        table, targets = await session_storage.storage(env, session_turns)
        out.tables.append(table)
        out.session_targets += targets

    async def fork_section(env: Environment) -> None:
        table, targets = await forks.fork_bench(env, session_turns)
        out.tables.append(table)
        out.session_targets += targets

    async def storage_section(env: Environment) -> None:
        table, targets = await session_storage.large(env)
        out.tables.append(table)
        out.session_targets += targets

    async def teams_section(env: Environment) -> None:
        tables, targets = await teams.teams(env, quick)
        out.tables += tables
        out.team_targets += targets

    async def live_section(env: Environment) -> None:
        out.tables.append(await live_stream(env.client, 5 if quick else 20, env.payloads))

    async def gateway_section(env: Environment) -> None:
        out.tables.append(
            await gateway_bench(
                env.client,
                env.info,
                watchers=1000,
                turns=1 if quick else 3,
                starts=20 if quick else 50,
                payloads=env.payloads,
            )
        )

    async def memory_section(env: Environment) -> None:
        with FakeModelApi(default=Reply.delay(3600, then=Reply.text("done"))) as fake:
            table, _ = await worker_memory(env, fake, memory_turns)
        out.tables.append(table)

    async def peers_section(env: Environment) -> None:
        only = set(args.peers.split(",")) if args.peers else None
        out.tables.append(await peers_bench.peers(env, peer_iterations, peer_rounds, only))

    async def replay_section(env: Environment) -> None:
        out.tables.append(await replay.replays(env, 3 if quick else 10))

    async def limits_section(env: Environment) -> None:
        table, targets = await limits.limits(env.client, env.info, env.tmp, quick)
        out.tables.append(table)
        out.limit_targets += targets

    # Memory last on the shared server: it leaves it 2,000 terminated workflows to clean up.
    sections = {
        "history": history_section,
        "overhead": overhead_section,
        "throughput": throughput_section,
        "recovery": recovery_section,
        "approvals": approvals_section,
        "elicitations": elicitations_section,
        "sessions": sessions_section,
        "storage": storage_section,
        "fork": fork_section,
        "teams": teams_section,
        "live": live_section,
        "gateway": gateway_section,
        "peers": peers_section,
        "replay": replay_section,
        "limits": limits_section,
        "memory": memory_section,
    }
    with tempfile.TemporaryDirectory(prefix="turnkeep-bench-") as name:
        async with environment(Path(name), agents) as env:
            report.progress(f"embedded dev server at {env.info.address}")
            for section, measure in sections.items():
                if section in only:
                    await _section(section, out, measure(env))
    if "flags" in only:

        async def flags_section() -> None:
            table, _ = await server_flags(quick)
            out.tables.append(table)

        await _section("flags", out, flags_section())
    return out


def _history_targets(growth: list[history.Growth], per_event: float) -> list[Target]:
    by_k = {g.iterations: g for g in growth}
    at, longest = by_k.get(history.TARGET_K), by_k.get(200)
    out = []
    if at is None:
        out.append(Target(HISTORY_TARGET, f"K={history.TARGET_K} not run", None))
    else:
        allowed = at.allowance(per_event)
        measured = (
            f"{at.history_bytes / 1024:,.0f} KB ≤ {allowed / 1024:,.0f} KB "
            f"({per_event:.0f} B/event)"
        )
        out.append(Target(HISTORY_TARGET, measured, at.history_bytes <= allowed))
    if longest is None:
        out.append(Target(LONG_TURN_TARGET, "K=200 not run", None))
    else:
        measured = (
            f"{len(longest.server_warnings)} server warnings; largest run "
            f"{longest.largest_run_bytes / 2**20:.1f} MB / {longest.largest_run_events:,} events, "
            f"largest event {longest.largest_event_bytes / 1024:.0f} KB; {longest.runs} run(s)"
        )
        out.append(Target(LONG_TURN_TARGET, measured, not longest.warned))
    return out


def main() -> None:
    args = _parser().parse_args()
    started = time.monotonic()
    load = os.getloadavg()
    results = asyncio.run(run(args))
    minutes = (time.monotonic() - started) / 60
    print(
        f"## turnkeep benchmarks, {datetime.date.today()}\n\n"
        f"{os.cpu_count()} CPUs (load average {load[0]:.1f} at the start), Python "
        f"{platform.python_version()}, temporalio {version('temporalio')}, "
        f"{'--quick, ' if args.quick else ''}{minutes:.1f} min.\n"
    )
    for table in results.tables:
        print(table.render())
    if results.targets:
        print(report.targets_table(results.targets).render())
    if results.session_targets:
        table = report.targets_table(results.session_targets, "Targets (issue #23)")
        print(table.render())
    if results.team_targets:
        print(report.targets_table(results.team_targets, "Targets (issues #33, #46)").render())
    if results.limit_targets:
        print(report.targets_table(results.limit_targets, "Targets (issue #48)").render())
    for failure in results.failures:
        print(f"**Section failed** (traceback on stderr): {failure}\n")
    if results.failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
