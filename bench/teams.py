"""Agents as tools (issue #33): what a call of ``agent__<name>``, a child turn on the agent's own
queue, costs against a call of a function tool, on workers built as ``turnkeep worker`` builds
them (``build_workers``: one on the parent's queue, one per agent's).

- **Overhead.** A turn whose model (``passthrough``) calls one instant function tool, one whose
  model calls one agent whose model (``passthrough`` too) answers at once, and the floor: the
  same parent answering without a call. What a call costs is its turn's time beyond the floor's
  (the call, and the model call that reads its result); the target is the agent call's at most
  1.5 times the function tool's. In the same rounds, a chain of one step and one of
  ``CHAIN_STEPS`` steps, each step that same instant agent: a step costs the difference over
  the steps added, against the same function-tool call. Each agent call and chain is measured
  twice in the same rounds: as a child turn (the default) and with the agent called inline
  (``call: inline``). Rounds of turns of each kind, the order reversed every other round;
  medians of the rounds.
- **Phases.** Where the time of one function-tool call and of one agent call goes, read off
  the parent's and the child's histories (``bench.call_phases``), after the overhead rounds.
- **Parallel.** One model answer calling ``PARALLEL_CALLS`` agents at once, each child's model
  the fake Anthropic API answering after ``MODEL_SECONDS``: the turn from its start request to
  its result, next to one such call alone.
- **History.** A parent (``playback``) making ``HISTORY_CALLS`` agent calls, one per iteration,
  against the same parent making as many function-tool calls: the bytes of every event of
  every run of the parent's own history, counted as ``bench.history`` counts them. Each child
  turn's history is its own (shown apart, not counted in the ratio).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client

from bench.call_phases import Phases, phases_table, read_phases
from bench.environment import Environment
from bench.report import Table, Target, median_interval, progress
from bench.turns import SERVER, TOOLS, conversation_bytes, runs_of
from turnkeep.client.turns import start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.worker.build import build_workers
from turnkeep.workflows.agent_tools import child_id

QUEUE = "bench-teams"
OVERHEAD_MAX = 1.5
CHAIN_STEPS = 5
CHAIN_STEP_MAX = 1.5
PARALLEL_CALLS = 10
MODEL_SECONDS = 1.0
PARALLEL_WITHIN = 1.15
HISTORY_CALLS = 100
HISTORY_MAX = 1.2
# The inline design (an agent's ``call: inline``: its loop in the caller's
# workflow, ``turnkeep.workflows.inline_agent``), measured beside the child turn in the same
# run, against the same function-tool call.
INLINE = "inline"

OVERHEAD_TARGET = f"an agent-as-tool call ≤ {OVERHEAD_MAX:g}× a function-tool call's overhead"
PARALLEL_TARGET = (
    f"{PARALLEL_CALLS} parallel agent calls, {MODEL_SECONDS:g} s model each: ≤ "
    f"{PARALLEL_WITHIN:g} s"
)
HISTORY_TARGET = (
    f"parent history, {HISTORY_CALLS} agent calls ≤ {HISTORY_MAX:g}× {HISTORY_CALLS} "
    "function-tool calls"
)
CHAIN_TARGET = f"each step of a chain ≤ {CHAIN_STEP_MAX:g}× a function-tool call's overhead"
TARGETS = [OVERHEAD_TARGET, CHAIN_TARGET, PARALLEL_TARGET, HISTORY_TARGET]
TARGETS += [f"{target} ({INLINE})" for target in TARGETS]

# The parents: one for the overhead (its prompt names the call), one fanning out to the slow
# agent, and two scripted ones of HISTORY_CALLS iterations with the same tools, so their plans
# (and the events recording them) are alike.
PARENT = "parent"
FANOUT = "fanout"
ECHO = "echo"
SLOW = "slow"
SHORT_CHAIN = "chain-1"
LONG_CHAIN = f"chain-{CHAIN_STEPS}"
BY_AGENT = f"{HISTORY_CALLS}-agent-calls"
BY_FUNCTION = f"{HISTORY_CALLS}-function-calls"
FUNCTION_CALL = f"***CALL_TOOL {SERVER}__line " + json.dumps({"i": 0})


def inline(agent: str) -> str:
    """The same agent, called inline."""
    return f"{agent}-{INLINE}"


def agent_call(agent: str) -> str:
    return f"***CALL_TOOL agent__{agent} " + json.dumps({"message": "result 0: ok"})


def _settings(env: Environment, fake: FakeModelApi) -> Settings:
    def scripted(name: str, call: Any, agent: str = ECHO) -> dict[str, Any]:
        script = env.tmp / f"teams-{name}.json"
        steps = [{"tool_calls": {f"c{i}": call(i)}} for i in range(HISTORY_CALLS)]
        script.write_text(json.dumps([*steps, "done"]), encoding="utf-8")
        return {
            "model": "playback",
            "playback": str(script),
            "servers": [SERVER],
            "agents": [agent],
            "max_iterations": HISTORY_CALLS + 1,
            "compaction": {"enabled": False},
        }

    # The function's result and the child's answer are the same line.
    def by_agent(i: int, agent: str = ECHO) -> dict[str, Any]:
        return {"name": f"agent__{agent}", "arguments": {"message": f"result {i}: ok"}}

    def by_inline_agent(i: int) -> dict[str, Any]:
        return by_agent(i, inline(ECHO))

    def by_function(i: int) -> dict[str, Any]:
        return {"name": f"{SERVER}__line", "arguments": {"i": i}}

    agents = {
        PARENT: {"model": "passthrough", "servers": [SERVER], "agents": [ECHO, inline(ECHO)]},
        FANOUT: {"model": "passthrough", "agents": [SLOW, inline(SLOW)]},
        ECHO: {"model": "passthrough"},
        inline(ECHO): {"model": "passthrough", "call": INLINE},
        SLOW: {"model": "anthropic.test-model"},
        inline(SLOW): {"model": "anthropic.test-model", "call": INLINE},
        SHORT_CHAIN: {"type": "chain", "sequence": [ECHO]},
        LONG_CHAIN: {"type": "chain", "sequence": [ECHO] * CHAIN_STEPS},
        inline(SHORT_CHAIN): {"type": "chain", "sequence": [inline(ECHO)]},
        inline(LONG_CHAIN): {"type": "chain", "sequence": [inline(ECHO)] * CHAIN_STEPS},
        BY_AGENT: scripted(BY_AGENT, by_agent),
        inline(BY_AGENT): scripted(inline(BY_AGENT), by_inline_agent, inline(ECHO)),
        BY_FUNCTION: scripted(BY_FUNCTION, by_function),
    }
    return Settings.model_validate(
        {
            "base_dir": str(env.tmp),
            "payload_storage": {"path": str(env.payloads)},
            "anthropic": {"api_key": "sk-bench", "base_url": fake.base_url_anthropic},
            "agents": agents,
        }
    )


async def _turn(client: Client, agent: str, prompt: str) -> tuple[float, str, TurnResult]:
    """Seconds from the start request to the decoded result, the workflow id, the result."""
    started = time.perf_counter()
    handle = await start_turn(client, TurnInput(agent=agent, messages=[prompt]), task_queue=QUEUE)
    result = await handle.result()
    return time.perf_counter() - started, handle.workflow_id, result


# --- overhead -------------------------------------------------------------------------------

FLOOR = "floor: the parent answers, no call"
FUNCTION = "one function-tool call"
AGENT = "one agent call (child turn)"
AGENT_INLINE = f"one agent call ({INLINE})"
CALLS = {
    FLOOR: "report",
    FUNCTION: FUNCTION_CALL,
    AGENT: agent_call(ECHO),
    AGENT_INLINE: agent_call(inline(ECHO)),
}
ONE_STEP = "a chain of 1 step"
STEPS = f"a chain of {CHAIN_STEPS} steps"
ONE_STEP_INLINE = f"a chain of 1 {INLINE} step"
STEPS_INLINE = f"a chain of {CHAIN_STEPS} {INLINE} steps"
CHAINS = {
    ONE_STEP: SHORT_CHAIN,
    STEPS: LONG_CHAIN,
    ONE_STEP_INLINE: inline(SHORT_CHAIN),
    STEPS_INLINE: inline(LONG_CHAIN),
}
# Each design's agent call and chains (short, long).
DESIGNS = {
    "child turn": (AGENT, ONE_STEP, STEPS),
    INLINE: (AGENT_INLINE, ONE_STEP_INLINE, STEPS_INLINE),
}
# Each variant's agent and prompt.
VARIANTS = {
    **{variant: (PARENT, prompt) for variant, prompt in CALLS.items()},
    **{variant: (chain, "report") for variant, chain in CHAINS.items()},
}


@dataclass(frozen=True)
class Overhead:
    # Per round: mean seconds per turn of each variant.
    rounds: list[dict[str, float]]

    def seconds(self, variant: str) -> float:
        return statistics.median(r[variant] for r in self.rounds)

    def extras(self, variant: str) -> list[float]:
        return [r[variant] - r[FLOOR] for r in self.rounds]

    def ratios(self, agent: str = AGENT) -> list[float]:
        return [
            (r[agent] - r[FLOOR]) / (r[FUNCTION] - r[FLOOR])
            for r in self.rounds
            if r[FUNCTION] > r[FLOOR]
        ]

    def extra(self, variant: str) -> float:
        return statistics.median(self.extras(variant))

    def ratio(self, agent: str = AGENT) -> float:
        """The agent call's extra over the function tool's, each the median of the rounds (a
        round's own ratio divides by a difference of a few tens of ms, which noise swings)."""
        return self.extra(agent) / self.extra(FUNCTION)

    def step(self, short: str = ONE_STEP, long: str = STEPS) -> float:
        """Seconds per chain step: the median of the rounds' differences between the long
        chain and the short one, over the steps it adds."""
        return statistics.median((r[long] - r[short]) / (CHAIN_STEPS - 1) for r in self.rounds)

    def step_ratio(self, short: str = ONE_STEP, long: str = STEPS) -> float:
        return self.step(short, long) / self.extra(FUNCTION)


async def overhead(client: Client, rounds: int, turns: int) -> Overhead:
    out = []
    for n in range(rounds):
        progress(f"teams: overhead round {n + 1}/{rounds}")
        order = list(VARIANTS) if n % 2 == 0 else list(reversed(VARIANTS))
        means = {}
        for variant in order:
            agent, prompt = VARIANTS[variant]
            times = [(await _turn(client, agent, prompt))[0] for _ in range(turns)]
            means[variant] = statistics.fmean(times)
        out.append(means)
    return Overhead(out)


def overhead_table(o: Overhead, turns: int) -> Table:
    table = Table(
        "Agents as tools: a call's overhead (instant models and tool)",
        ["turn", "ms per turn", "beyond the floor (ms)", "÷ function-tool call"],
    )
    function_extra = o.extra(FUNCTION)
    for variant in CALLS:
        extra = o.extra(variant) if variant != FLOOR else 0.0
        table.add(
            variant,
            f"{o.seconds(variant) * 1000:.1f}",
            "" if variant == FLOOR else f"{extra * 1000:.1f}",
            "" if variant == FLOOR else f"{extra / function_extra:.2f}×",
        )
    for variant in CHAINS:
        table.add(variant, f"{o.seconds(variant) * 1000:.1f}", "", "")
    for design, (_, short, long) in DESIGNS.items():
        table.add(
            f"each chain step beyond the first ({design})",
            "",
            f"{o.step(short, long) * 1000:.1f}",
            f"{o.step_ratio(short, long):.2f}×",
        )
    table.notes.append(
        f"{len(o.rounds)} rounds of {turns} turns of each, one after another (the order reversed "
        "every other round). ms per turn: the median of the rounds' means; beyond the floor: "
        "the median of the rounds' differences to the floor, which is the call and the model "
        "call that reads its result; the ratio: of those medians. The parent is the "
        "`passthrough` model. The child turn is `passthrough` too (its `prepare_turn` and one "
        "model call), started as a child workflow on the agent's own queue of the same worker "
        "process. A chain step: the chain of "
        f"{CHAIN_STEPS} steps less the chain of 1, over the {CHAIN_STEPS - 1} steps it adds "
        "(the median of the rounds'), each step that same child turn. The inline lines: the "
        "same agent with `call: inline`, its loop run inside the caller's workflow (its "
        "`prepare_turn` a local activity, its model call an activity of the caller's)."
    )
    return table


async def phases(client: Client, turns: int) -> Phases:
    """Where the time of a function-tool call and of an agent call goes (``call_phases``)."""
    progress("teams: phases")
    ids = {}
    for variant in (FUNCTION, AGENT):
        agent, prompt = VARIANTS[variant]
        ids[variant] = [(await _turn(client, agent, prompt))[1] for _ in range(turns)]
    return await read_phases(client, ids[FUNCTION], ids[AGENT])


# --- parallel -------------------------------------------------------------------------------


def fan_out(calls: int, agent: str = SLOW) -> str:
    return "\n".join(
        f"***CALL_TOOL agent__{agent} " + json.dumps({"message": f"part {i}"}) for i in range(calls)
    )


async def parallel(client: Client, repeats: int) -> dict[tuple[str, int], list[float]]:
    """Per (agent, calls in one answer): each turn's seconds."""
    out: dict[tuple[str, int], list[float]] = {
        (agent, calls): [] for agent in (SLOW, inline(SLOW)) for calls in (1, PARALLEL_CALLS)
    }
    for n in range(repeats):
        progress(f"teams: parallel {n + 1}/{repeats}")
        for agent, calls in out:
            seconds, _, result = await _turn(client, FANOUT, fan_out(calls, agent))
            answers = result.messages[2].tool_results or {}
            if len(answers) != calls or any(a.is_error for a in answers.values()):
                raise RuntimeError(f"the fan-out turn of {calls} call(s) did not get every answer")
            out[(agent, calls)].append(seconds)
    return out


def parallel_table(times: dict[tuple[str, int], list[float]]) -> Table:
    table = Table(
        f"Agents as tools: parallel calls, each child's model taking {MODEL_SECONDS:g} s",
        ["agent calls in one answer", "turn (s), median", "range (s)", "beyond one model call"],
    )
    for (agent, calls), seconds in times.items():
        median = statistics.median(seconds)
        table.add(
            f"{calls} ({INLINE})" if agent != SLOW else calls,
            f"{median:.2f}",
            f"{min(seconds):.2f}–{max(seconds):.2f}",
            f"+{(median - MODEL_SECONDS) * 1000:.0f} ms",
        )
    table.notes.append(
        f"The children's model is the fake Anthropic API (`FakeModelApi`) answering each request "
        f"after {MODEL_SECONDS:g} s (`Reply.delay`); the parent is `passthrough`, its calls all in "
        f"one answer, no `max_parallel`. Each turn timed from its start request to its result, "
        f"{len(next(iter(times.values())))} of each."
    )
    return table


# --- history --------------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    runs: int
    events: int
    bytes: int
    conversation_bytes: int
    children_bytes: int  # the children's own histories, all of them


async def history(client: Client, agent: str, *, children: bool = True) -> History:
    progress(f"teams: history, {agent}")
    _, workflow_id, result = await _turn(client, agent, "go")
    runs = await runs_of(client, workflow_id)
    events = [e for run in runs for e in run]
    children_bytes = 0
    for message in result.messages:
        for call_id, call in (message.tool_calls or {}).items():
            if children and call.name.startswith("agent__"):
                step = int(call_id.removeprefix("c")) + 1  # model call c<i> was call i + 1
                for run in await runs_of(client, child_id(workflow_id, step, call_id)):
                    children_bytes += sum(e.ByteSize() for e in run)
    return History(
        runs=len(runs),
        events=len(events),
        bytes=sum(e.ByteSize() for e in events),
        conversation_bytes=conversation_bytes(result),
        children_bytes=children_bytes,
    )


def history_table(by_function: History, by_agent: History, by_inline: History) -> Table:
    table = Table(
        f"Agents as tools: the parent's history over {HISTORY_CALLS} calls, one per iteration",
        [
            "parent calling",
            "runs",
            "events",
            "history KB",
            "conversation KB",
            "÷ function-tool parent",
            "children's histories KB",
        ],
    )
    parents = (
        ("a function tool", by_function),
        ("an agent", by_agent),
        (f"an agent ({INLINE})", by_inline),
    )
    for name, h in parents:
        table.add(
            name,
            h.runs,
            f"{h.events:,}",
            f"{h.bytes / 1024:,.1f}",
            f"{h.conversation_bytes / 1024:,.1f}",
            f"{h.bytes / by_function.bytes:.2f}×",
            "" if h is by_function else f"{h.children_bytes / 1024:,.1f}",
        )
    table.notes.append(
        "history: the bytes of every event of every run of the parent's own workflow "
        "(continue-as-new included), as the `history` section counts them. Both parents are "
        "`playback` with the same tools; the child echoes the line the function returns. The "
        "children's histories are their own workflows', listed apart; an agent called inline "
        "has none (its steps are in the parent's)."
    )
    return table


# --- the section ----------------------------------------------------------------------------


async def teams(env: Environment, quick: bool) -> tuple[list[Table], list[Target]]:
    rounds, turns, repeats = (5, 5, 3) if quick else (15, 10, 5)
    delay = Reply.delay(MODEL_SECONDS, then=Reply.text("part done"))
    with FakeModelApi(default=delay) as fake:
        settings = _settings(env, fake)
        async with build_workers(env.client, settings, task_queue=QUEUE, function_tools=TOOLS):
            o = await overhead(env.client, rounds, turns)
            p = await phases(env.client, turns)
            times = await parallel(env.client, repeats)
            by_function = await history(env.client, BY_FUNCTION)
            by_agent = await history(env.client, BY_AGENT)
            by_inline = await history(env.client, inline(BY_AGENT), children=False)

    targets = [
        *_targets(o, times, by_function, by_agent, (AGENT, ONE_STEP, STEPS), SLOW, ""),
        *_targets(
            o,
            times,
            by_function,
            by_inline,
            (AGENT_INLINE, ONE_STEP_INLINE, STEPS_INLINE),
            inline(SLOW),
            f" ({INLINE})",
        ),
    ]
    tables = [
        overhead_table(o, turns),
        phases_table(p),
        parallel_table(times),
        history_table(by_function, by_agent, by_inline),
    ]
    return tables, targets


def _targets(
    o: Overhead,
    times: dict[tuple[str, int], list[float]],
    by_function: History,
    by_agent: History,
    variants: tuple[str, str, str],
    slow: str,
    suffix: str,
) -> list[Target]:
    """The targets, as one design (its agent call and chains, ``variants``; its slow agent)
    meets them."""
    agent, short, long = variants
    low, high = median_interval(o.ratios(agent))
    ratio = o.ratio(agent)
    agent_ms = o.extra(agent) * 1000
    function_ms = o.extra(FUNCTION) * 1000
    fan = statistics.median(times[(slow, PARALLEL_CALLS)])
    history_ratio = by_agent.bytes / by_function.bytes
    step, step_ratio = o.step(short, long), o.step_ratio(short, long)
    return [
        Target(
            OVERHEAD_TARGET + suffix,
            f"{ratio:.2f}× ({agent_ms:.1f} ms against {function_ms:.1f} ms beyond the floor; "
            f"95% interval of the median of the rounds' own ratios {low:.2f}–{high:.2f}×)",
            ratio <= OVERHEAD_MAX,
        ),
        Target(
            CHAIN_TARGET + suffix,
            f"{step_ratio:.2f}× ({step * 1000:.1f} ms a step against {function_ms:.1f} ms)",
            step_ratio <= CHAIN_STEP_MAX,
        ),
        Target(
            PARALLEL_TARGET + suffix,
            f"{fan:.2f} s (median of {len(times[(slow, PARALLEL_CALLS)])}; one call alone "
            f"{statistics.median(times[(slow, 1)]):.2f} s)",
            fan <= PARALLEL_WITHIN,
        ),
        Target(
            HISTORY_TARGET + suffix,
            f"{history_ratio:.2f}× ({by_agent.bytes / 1024:,.0f} KB against "
            f"{by_function.bytes / 1024:,.0f} KB)",
            history_ratio <= HISTORY_MAX,
        ),
    ]
