"""Loop overhead: a turn of K iterations with an instant scripted model and an instant tool,
against the floor — a bare workflow awaiting as many no-op activities as the turn runs (its
K + 1 model calls, K tool calls, ``prepare_turn`` and ``list_tools``, counted in its history).

And where the difference goes:

- phases of the turn and the floor from their histories (``bench.phases``);
- the carrying floor (``bench.carry_floor``): what a turn's steps carry (its payloads,
  summaries, timeouts, turnkeep's data converter and payload storage) without turnkeep's code,
  which splits the overhead into carrying a turn's data and turnkeep's own work;
- floor variants that each add one thing a turn does to every activity step — turnkeep's data
  converter (pydantic JSON, external payload storage), a heartbeat, a query of the workflow
  (how ``llm_step`` reads its input when it runs on another worker), a 5 KB result, an outcome
  timer (how a turn records a model call's outcome) — and one without the workflow sandbox,
  to show the sandbox's share of a step;
- the turn with the model input read by query (``build_worker(model_input_handoff=False)``),
  with external payload storage off, and with its tool declared ``async`` (no thread hop).

All variants run round-robin (every other round in reverse), so the machine's noise hits them
alike; medians are reported. The headline pair (the turn with 5 KB results and its floor) runs
``HEADLINE_PAIRS`` times a round, each turn next to its own floor: a round's runs spread by
±25% on this kind of machine, and the target is read off that pair.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.worker import UnsandboxedWorkflowRunner

from bench.environment import (
    FLOOR,
    TURNS,
    Environment,
    carry_worker,
    floor_worker,
    turn_worker,
)
from bench.floor import BLOB, HEARTBEAT, NOOP, QUERY, FloorInput
from bench.phases import WFT_QUEUED, WFT_RUN, medians
from bench.report import Table, progress
from bench.turns import TOOLS, Agent, count, run_carry, run_floor, run_turn, runs_of, settings
from turnkeep.client.connection import connect
from turnkeep.contract.activity_io import CALL_TOOL, LLM_STEP
from turnkeep.worker.build import build_worker

K = 20
# Runs of the headline pair per round (the other variants run once): more pairs for the figure
# the target is read off, for a fraction of a round's time (a round runs 13 variants).
HEADLINE_PAIRS = 3
BY_QUERY = "bench-turns-by-query"
NO_STORAGE = "bench-turns-no-storage"
FLOOR_CONVERTER = "bench-floor-converter"
FLOOR_UNSANDBOXED = "bench-floor-unsandboxed"
CARRY = "bench-carry"

TURN = "turn, 5 KB tool results"
TURN_SHORT = "turn, short tool results"
TURN_ASYNC = "turn, 5 KB, tool declared async"
TURN_BY_QUERY = "turn, 5 KB, model input read by query"
TURN_NO_STORAGE = "turn, 5 KB, payload storage off"
FLOOR_BARE = "floor: no-op activities"
FLOOR_CARRY = "floor carrying a turn's data (no turnkeep code)"
TIMER = "timer"  # not an activity: the floor's noop, and an outcome timer (see ``bench.floor``)
ABLATIONS = {
    "floor + turnkeep's data converter": (FLOOR_CONVERTER, NOOP),
    "floor + a heartbeat per activity": (FLOOR, HEARTBEAT),
    "floor + a query of the workflow per activity": (FLOOR, QUERY),
    "floor + a 5 KB result per activity": (FLOOR, BLOB),
    "floor + an outcome timer per activity": (FLOOR, TIMER),
    "floor without the workflow sandbox": (FLOOR_UNSANDBOXED, NOOP),
}


@dataclass(frozen=True)
class Overhead:
    iterations: int
    activities: int  # per turn, and so per floor
    # variant -> rounds -> wall-clock seconds of each run in that round
    samples: dict[str, list[list[float]]]
    phases: dict[str, dict[str, float]]  # turn / floor -> phase -> median ms
    workflow_tasks: dict[str, int]  # turn / floor -> workflow tasks

    def seconds(self, variant: str) -> float:
        return statistics.median(s for round_ in self.samples[variant] for s in round_)

    # Ratios and differences are taken within a round, against a floor of that round, then the
    # median over all of them: load that comes and goes hits both sides of each pair alike.
    def ratio(self, variant: str = TURN) -> float:
        return statistics.median(self.ratios(variant))

    def ratios(self, variant: str = TURN) -> list[float]:
        """Each run's ratio against its floor in the same round."""
        return [v / f for v, f in self._pairs(variant)]

    def over_carry(self) -> float:
        """The headline turn against the carrying floor of its round (median over rounds of
        the round's median turn run ÷ its carrying-floor run): turnkeep's own share."""
        rounds = zip(self.samples[TURN], self.samples[FLOOR_CARRY], strict=True)
        return statistics.median(statistics.median(t) / statistics.median(c) for t, c in rounds)

    def extra(self, variant: str) -> float:
        return statistics.median(v - f for v, f in self._pairs(variant))

    def _pairs(self, variant: str) -> list[tuple[float, float]]:
        """(run, its floor): the floor run next to it for the headline turn, which runs as
        often as the floor; otherwise the median floor of the same round."""
        pairs: list[tuple[float, float]] = []
        rounds = zip(self.samples[variant], self.samples[FLOOR_BARE], strict=True)
        for runs, floors in rounds:
            if len(runs) == len(floors):
                pairs += zip(runs, floors, strict=True)
            else:
                pairs += [(run, statistics.median(floors)) for run in runs]
        return pairs


async def loop_overhead(env: Environment, repeats: int) -> tuple[list[Table], Overhead]:
    agent, short, in_loop = Agent(K), Agent(K, "line"), Agent(K, "blob_async")
    async with AsyncExitStack() as stack:
        # The same turn worker, but every model call reads its input by query.
        await stack.enter_async_context(turn_worker(env, BY_QUERY, model_input_handoff=False))
        # And with no external payload storage (payloads this small are inline anyway, but the
        # SDK visits every payload for it).
        inline = settings(env.tmp, [agent], payload_storage={"driver": "off"})
        inline_client = await connect(env.info.address, env.info.namespace, settings=inline)
        await stack.enter_async_context(
            build_worker(inline_client, inline, function_tools=TOOLS, task_queue=NO_STORAGE)
        )
        await stack.enter_async_context(floor_worker(env.client, FLOOR_CONVERTER))
        await stack.enter_async_context(carry_worker(env, CARRY))
        await stack.enter_async_context(
            floor_worker(env.plain, FLOOR_UNSANDBOXED, workflow_runner=UnsandboxedWorkflowRunner())
        )
        warm = await run_turn(env.client, TURNS, agent)
        (turn_events,) = await runs_of(env.client, warm.workflow_id, warm.first_run_id)
        activities = count(turn_events, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)

        histories: dict[str, list[list[HistoryEvent]]] = defaultdict(list)

        def turn(queue: str, which: Agent) -> Callable[[], Awaitable[float]]:
            client = inline_client if queue == NO_STORAGE else env.client

            async def go() -> float:
                done = await run_turn(client, queue, which)
                if queue == TURNS and which == agent:
                    histories["turn"] += await runs_of(env.client, done.workflow_id)
                return done.seconds

            return go

        def floor(queue: str, activity: str) -> Callable[[], Awaitable[float]]:
            client = env.client if queue == FLOOR_CONVERTER else env.plain
            heartbeat = 10.0 if activity == HEARTBEAT else None

            async def go() -> float:
                if activity == TIMER:
                    spec = FloorInput(activities, NOOP, outcome_timer=True)
                else:
                    spec = FloorInput(activities, activity, heartbeat)
                seconds, workflow_id = await run_floor(client, queue, spec)
                if queue == FLOOR and activity == NOOP:
                    histories["floor"] += await runs_of(client, workflow_id)
                return seconds

            return go

        headline: dict[str, Callable[[], Awaitable[float]]] = {
            TURN: turn(TURNS, agent),
            FLOOR_BARE: floor(FLOOR, NOOP),
        }
        others: dict[str, Callable[[], Awaitable[float]]] = {
            TURN_SHORT: turn(TURNS, short),
            TURN_ASYNC: turn(TURNS, in_loop),
            TURN_BY_QUERY: turn(BY_QUERY, agent),
            TURN_NO_STORAGE: turn(NO_STORAGE, agent),
            FLOOR_CARRY: lambda: run_carry(env.client, CARRY, K),
            **{name: floor(queue, activity) for name, (queue, activity) in ABLATIONS.items()},
        }
        for run in [*headline.values(), *others.values()]:  # warm-up: imports, sandboxes, MCP
            await run()
        histories.clear()
        samples: dict[str, list[list[float]]] = defaultdict(list)
        for i in range(repeats):
            progress(f"loop overhead: round {i + 1} of {repeats}")
            # Every other round in reverse, so that no variant always follows the same one.
            order = [*list(headline.items()) * HEADLINE_PAIRS, *others.items()]
            this_round: dict[str, list[float]] = defaultdict(list)
            for name, run in order if i % 2 == 0 else reversed(order):
                this_round[name].append(await run())
            for name, runs in this_round.items():
                samples[name].append(runs)
    result = Overhead(
        iterations=K,
        activities=activities,
        samples=dict(samples),
        phases={name: medians(runs) for name, runs in histories.items()},
        workflow_tasks={
            name: count(runs[0], EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED)
            for name, runs in histories.items()
        },
    )
    return [_headline(result, repeats), _phases(result), _ablations(result)], result


def _headline(o: Overhead, repeats: int) -> Table:
    table = Table(
        f"Loop overhead: a {o.iterations}-iteration turn, instant model and tool",
        ["", "ms per iteration", "floor ms per iteration", "÷ floor"],
    )
    floor = o.seconds(FLOOR_BARE) * 1000 / o.iterations
    for variant in (TURN, TURN_SHORT, TURN_ASYNC, TURN_BY_QUERY, TURN_NO_STORAGE, FLOOR_CARRY):
        mine = o.seconds(variant) * 1000 / o.iterations
        table.add(variant, f"{mine:.1f}", f"{floor:.1f}", f"{o.ratio(variant):.2f}×")
    table.notes.append(
        f"Medians of {repeats} rounds; the first turn runs {HEADLINE_PAIRS} times a round, each "
        "run next to a floor run, the others once. ÷ floor is the median of each run's ratio "
        "to its floor (the first turn's own; for the others, the round's median floor). The "
        f"floor awaits {o.activities} no-op activities, as many as the turn runs. *Read by query*: "
        "how a model call gets its input when it runs on another worker than its workflow (and "
        "how every call did before the in-process hand-off). *Declared async*: the same tool "
        "as an `async def`, called on the worker's event loop; a plain `def` tool runs in a "
        "thread (as FastMCP runs it), so it could not stall heartbeats and other steps. "
        "*Carrying a turn's data*: bench/carry_floor.py, the turn's activities with its payloads, "
        "summaries, timeouts and result, on turnkeep's data converter and payload storage, "
        "answering at once, with none of turnkeep's code; the first turn ÷ that floor is "
        f"{o.over_carry():.2f}×, turnkeep's own share (loop, MCP tool runtime, model adapter, "
        "operator surface)."
    )
    return table


def _phases(o: Overhead) -> Table:
    turn, floor = o.phases["turn"], o.phases["floor"]
    per_iteration = o.workflow_tasks["turn"] / o.iterations
    table = Table(
        "Where an iteration's time goes (median ms per occurrence, from history timestamps)",
        ["phase", "turn", "floor", "extra ms per iteration"],
    )
    table.add("workflow tasks", o.workflow_tasks["turn"], o.workflow_tasks["floor"], "")
    for phase in (WFT_QUEUED, WFT_RUN):
        extra = (turn[phase] - floor[phase]) * per_iteration
        table.add(phase, f"{turn[phase]:.1f}", f"{floor[phase]:.1f}", f"{extra:+.1f}")
    noop = floor[f"{NOOP} run"]
    for activity in (LLM_STEP, CALL_TOOL):
        mine = turn[f"{activity} run"]
        table.add(
            f"{activity} run (floor: noop run)",
            f"{mine:.1f}",
            f"{noop:.1f}",
            f"{mine - noop:+.1f}",
        )
    table.add(
        "wall clock per iteration",
        f"{o.seconds(TURN) * 1000 / o.iterations:.1f}",
        f"{o.seconds(FLOOR_BARE) * 1000 / o.iterations:.1f}",
        f"{o.extra(TURN) * 1000 / o.iterations:+.1f}",
    )
    more = o.workflow_tasks["turn"] - o.workflow_tasks["floor"]
    table.notes.append(
        "Phases as in bench/phases.py, over every occurrence in all rounds' histories. The "
        + (
            "turn runs no more workflow tasks than the floor (one per activity, plus one)."
            if more <= 0
            else f"turn runs {more} more workflow tasks than the floor, for as many activities."
        )
    )
    return table


def _ablations(o: Overhead) -> Table:
    table = Table(
        "What one thing costs per activity step (floor variants, same number of activities)",
        ["floor variant", "ms per activity step", "Δ vs floor (ms)"],
    )
    table.add(FLOOR_BARE, f"{o.seconds(FLOOR_BARE) * 1000 / o.activities:.1f}", "")
    for name in ABLATIONS:
        step = o.seconds(name) * 1000 / o.activities
        table.add(name, f"{step:.1f}", f"{o.extra(name) * 1000 / o.activities:+.1f}")
    table.notes.append("Δ: the median over rounds of (variant − floor of the same round).")
    return table
