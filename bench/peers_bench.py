"""The peers' workload (issue #46): the same scripted turn through turnkeep and through the
durable peers, on one dev server, next to the in-process floor.

The turn: the prompt ``bench K=<K>`` to an agent with one function tool returning 5 KB, its
model a fake OpenAI Chat Completions server (``FakeModelApi``) that calls the tool K times, one
call per answer, and then answers ``done``. Every request carries the conversation so far, so
it grows by ~5 KB per iteration. The fake server answers from the request alone (the tool
results it has, and the K in its first user message), so every framework gets the same script
whatever it names its tool.

- **turnkeep**: a ``TurnWorkflow`` of an ``openai.`` agent pointed at the fake server, with the
  function tool ``blob``, on a worker in this process built as the CLI builds one (payload
  storage on, compaction off);
- **Pydantic AI + Temporal**: ``pydantic-ai``'s ``TemporalDurability`` (its model requests and
  tool call as activities) in a workflow (``bench/peers/pydantic_ai_peer.py``);
- **OpenAI Agents + Temporal**: ``temporalio.contrib.openai_agents`` with the tool as an
  activity (``bench/peers/openai_agents_peer.py``);
- **fast-agent**, in process with no Temporal: the floor (``bench/peers/fast_agent_peer.py``).

The peers' packages conflict with turnkeep's pins, so each runs in a venv of its own, made on
first use under ``.venv/peers/<peer>`` with pinned versions (``PEERS``), as a subprocess that
runs a warm-up turn and then one turn per K, timing each from its start to its result, and
prints JSON. The dev server and the fake server are this process's; the peers' workers run in
their subprocesses, turnkeep's here. Each round runs every peer, the order rotated by one each
round; figures are medians of the rounds.

The fake server's own share: the CPU time of its thread per request (reading and parsing it,
answering, writing), counted by the fake server itself for each K (``TimedFakeApi``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.environment import Environment
from bench.report import Table, progress
from bench.turns import TOOLS
from turnkeep.client.connection import connect
from turnkeep.client.turns import start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.turn_io import TurnInput
from turnkeep.testing.fake_api import FakeModelApi, Recorded, Reply, Step
from turnkeep.worker.build import build_worker

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".venv" / "peers"
ITERATIONS = (20, 100, 400)
QUICK_ITERATIONS = (20, 100)
ROUNDS = 3
WARMUP = 2
TURNKEEP = "turnkeep"
FLOOR = "fast-agent"
QUEUE = "bench-peers"
AGENT = "peers"
PROMPT_K = re.compile(r"bench K=(\d+)")
# A peer's subprocess may run several long turns; past this it is taken as hung.
SUBPROCESS_SECONDS = 1200


@dataclass(frozen=True)
class Peer:
    name: str  # also its venv's directory
    label: str
    module: str  # run as ``python -m`` from the repository's root
    requirements: tuple[str, ...]
    min_python: tuple[int, int] = (3, 11)
    durable: bool = True


PEERS = (
    Peer(
        "pydantic-ai",
        "Pydantic AI + Temporal",
        "bench.peers.pydantic_ai_peer",
        ("pydantic-ai-slim[openai,temporal]==2.78.0", "temporalio==1.35.0"),
    ),
    Peer(
        "openai-agents",
        "OpenAI Agents + Temporal",
        "bench.peers.openai_agents_peer",
        # temporalio 1.35's extra brings the integration (temporalio-openai-agents), which
        # takes openai-agents up to 0.22.x (0.25 does not resolve with it).
        ("temporalio[openai-agents]==1.35.0", "openai-agents==0.22.3"),
    ),
    Peer(
        "fast-agent",
        "fast-agent (in process, no Temporal)",
        "bench.peers.fast_agent_peer",
        ("fast-agent-mcp==0.10.48",),
        min_python=(3, 12),  # fast-agent 0.10 requires Python ≥ 3.12
        durable=False,
    ),
)
LABELS = {TURNKEEP: "turnkeep", **{p.name: p.label for p in PEERS}}


# --- the fake server --------------------------------------------------------------------------


def _k_of(messages: list[Any]) -> int | None:
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            found = PROMPT_K.search(json.dumps(message.get("content")))
            return int(found.group(1)) if found else None
    return None


def _tool_name(tools: list[Any]) -> str | None:
    names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
    named = [n for n in names if isinstance(n, str)]
    # turnkeep's agent sees the function-tool server's three tools: the 5 KB one is ``blob``.
    return next((n for n in named if n.endswith("blob")), named[0] if named else None)


def respond(recorded: Recorded) -> Step | None:
    """The workload's script, read off the request: the next tool call until K tool results
    are in the conversation, then the final answer."""
    body = recorded.body
    if not isinstance(body, dict):
        return None
    messages = body.get("messages") or []
    k = _k_of(messages)
    done = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")
    name = _tool_name(body.get("tools") or [])
    if k is None or name is None or done >= k:
        return Reply.text("done")
    return Reply.tool_calls((f"call_{done}", name, {"i": done}))


class TimedFakeApi(FakeModelApi):
    """The fake API, counting its thread's CPU time per request by the K the request names:
    from the end of one answer to the end of the next is reading and parsing a request and
    answering it (the thread does nothing else, and waiting costs no CPU)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.cpu_by_k: dict[int, tuple[float, int]] = {}  # K: (seconds, requests)
        self._last_end = 0.0

    async def _answer(
        self,
        path: str,
        headers: dict[str, str],
        body: Any,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        try:
            return await super()._answer(path, headers, body, reader, writer)
        finally:
            end = time.thread_time()
            messages = body.get("messages") if isinstance(body, dict) else None
            k = _k_of(messages) if isinstance(messages, list) else None
            if k is not None and self._last_end:
                seconds, requests = self.cpu_by_k.get(k, (0.0, 0))
                self.cpu_by_k[k] = (seconds + end - self._last_end, requests + 1)
            self._last_end = end

    def snapshot(self) -> dict[int, tuple[float, int]]:
        return dict(self.cpu_by_k)


def fake_share(
    outcome: Outcome,
    before: dict[int, tuple[float, int]],
    after: dict[int, tuple[float, int]],
    k: int,
) -> None:
    """The fake server's CPU per request and its requests, for the turn of ``k`` between two
    snapshots."""
    seconds, requests = after.get(k, (0.0, 0))
    seconds0, requests0 = before.get(k, (0.0, 0))
    if requests > requests0:
        outcome.fake_cpu[k] = (seconds - seconds0) / (requests - requests0)
        outcome.requests[k] = requests - requests0


# --- the peers' venvs -------------------------------------------------------------------------


def _python_at_least(version: tuple[int, int]) -> str:
    """An interpreter of at least ``version``: this one, else one on PATH, else pyenv's."""
    if sys.version_info >= version:
        return sys.executable
    names = [f"python3.{minor}" for minor in range(version[1], 16)]
    candidates = [found for name in names if (found := shutil.which(name))]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(str(p) for p in pyenv.glob("3.*/bin/python3"))
    check = f"import sys; sys.exit(sys.version_info < {version!r})"
    for candidate in candidates:
        run = subprocess.run([candidate, "-c", check], capture_output=True, check=False)
        if run.returncode == 0:
            return candidate
    raise RuntimeError(f"no Python ≥ {version[0]}.{version[1]} found (tried {candidates})")


def ensure_venv(peer: Peer) -> Path:
    """The peer's venv's Python, the venv made (or remade, if its pins changed) first."""
    venv = VENVS / peer.name
    python = venv / "bin" / "python"
    marker = venv / ".bench-requirements"
    wanted = "\n".join(peer.requirements)
    if python.exists() and marker.exists() and marker.read_text(encoding="utf-8") == wanted:
        return python
    progress(f"peers: making {venv} ({', '.join(peer.requirements)}), a few minutes")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([_python_at_least(peer.min_python), "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *peer.requirements],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    marker.write_text(wanted, encoding="utf-8")
    return python


def installed_versions(python: Path, packages: list[str]) -> str:
    code = (
        "import importlib.metadata as m, sys\n"
        "print(', '.join(f'{p} {m.version(p)}' for p in sys.argv[1:]))"
    )
    run = subprocess.run(
        [str(python), "-c", code, *packages], capture_output=True, text=True, check=False
    )
    return run.stdout.strip() or run.stderr.strip()[-200:]


# --- one round of one peer --------------------------------------------------------------------


@dataclass
class Outcome:
    seconds: dict[int, float] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    fake_cpu: dict[int, float] = field(default_factory=dict)  # the fake server's, per request
    requests: dict[int, int] = field(default_factory=dict)  # the fake server got, per turn
    # fast-agent: the time its turn spent making OpenAI clients (one per model request).
    client_seconds: dict[int, float] = field(default_factory=dict)


def run_peer(
    peer: Peer, python: Path, fake: TimedFakeApi, address: str, iterations: list[int]
) -> Outcome:
    """One subprocess of the peer running its warm-up turn and a turn per K."""
    command = [
        str(python),
        "-m",
        peer.module,
        "--address",
        address,
        "--base-url",
        fake.base_url_openai,
        "--queue",
        f"{QUEUE}-{peer.name}-{time.monotonic_ns()}",
        "--iterations",
        ",".join(map(str, iterations)),
        "--warmup",
        str(WARMUP),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    before = fake.snapshot()
    try:
        run = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Outcome(errors={k: f"no result within {SUBPROCESS_SECONDS} s" for k in iterations})
    if run.returncode != 0 or not run.stdout.strip():
        progress(f"peers: {peer.name} exited {run.returncode}: {run.stderr[-2000:]}")
        return Outcome(errors={k: f"exited {run.returncode}" for k in iterations})
    result = json.loads(run.stdout.strip().splitlines()[-1])
    outcome = Outcome(
        seconds={int(k): float(v) for k, v in result["seconds"].items()},
        errors={int(k): str(v) for k, v in result["errors"].items()},
        client_seconds={
            int(k): float(v["client_seconds"])
            for k, v in result.get("extra", {}).items()
            if "client_seconds" in v
        },
    )
    after = fake.snapshot()
    for k in outcome.seconds:
        fake_share(outcome, before, after, k)
    return outcome


def turnkeep_settings(env: Environment, fake: FakeModelApi, longest: int) -> Settings:
    return Settings.model_validate(
        {
            "base_dir": str(env.tmp / "peers"),
            "payload_storage": {"path": str(env.payloads)},
            "openai": {"api_key": "sk-bench-peers", "base_url": fake.base_url_openai},
            "agents": {
                AGENT: {
                    "model": "openai.bench",
                    "servers": ["local"],
                    "max_iterations": longest + 5,
                    "compaction": {"enabled": False},
                }
            },
        }
    )


@contextlib.asynccontextmanager
async def turnkeep_runner(
    env: Environment, fake: TimedFakeApi, longest: int
) -> AsyncIterator[Callable[[int], Any]]:
    settings = turnkeep_settings(env, fake, longest)
    client = await connect(env.info.address, env.info.namespace, settings=settings)
    async with build_worker(client, settings, function_tools=TOOLS, task_queue=QUEUE):

        async def run_turn(k: int) -> float:
            started = time.perf_counter()
            handle = await start_turn(
                client, TurnInput(agent=AGENT, messages=[f"bench K={k}"]), task_queue=QUEUE
            )
            await handle.result()
            return time.perf_counter() - started

        await run_turn(WARMUP)
        yield run_turn


# --- the section ------------------------------------------------------------------------------


@dataclass
class PeerResults:
    rounds: dict[str, list[Outcome]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def ms_per_iteration(self, peer: str, k: int) -> float | None:
        values = [o.seconds[k] * 1000 / k for o in self.rounds.get(peer, []) if k in o.seconds]
        return statistics.median(values) if values else None

    def ms_less_clients(self, peer: str, k: int) -> float | None:
        """ms per iteration less the time spent making OpenAI clients (fast-agent's)."""
        values = [
            (o.seconds[k] - o.client_seconds[k]) * 1000 / k
            for o in self.rounds.get(peer, [])
            if k in o.seconds and k in o.client_seconds
        ]
        return statistics.median(values) if values else None

    def spread(self, peer: str, k: int) -> tuple[float, float] | None:
        values = [o.seconds[k] * 1000 / k for o in self.rounds.get(peer, []) if k in o.seconds]
        return (min(values), max(values)) if values else None

    def fake_ms(self, peer: str, k: int) -> float | None:
        values = [o.fake_cpu[k] * 1000 for o in self.rounds.get(peer, []) if k in o.fake_cpu]
        return statistics.median(values) if values else None

    def error(self, peer: str, k: int) -> str | None:
        return next((o.errors[k] for o in self.rounds.get(peer, []) if k in o.errors), None)


VERSIONS = {
    "pydantic-ai": ["pydantic-ai-slim", "temporalio", "openai"],
    "openai-agents": ["openai-agents", "temporalio", "temporalio-openai-agents", "openai"],
    "fast-agent": ["fast-agent-mcp", "openai"],
}


async def peers(
    env: Environment,
    iterations: list[int],
    rounds: int = ROUNDS,
    only: set[str] | None = None,
) -> Table:
    """The section; ``only`` names the lines to run (``turnkeep`` and peers' names), all by
    default: turnkeep alone needs none of the peers' venvs."""
    chosen = [p for p in PEERS if only is None or p.name in only]
    pythons = {p.name: ensure_venv(p) for p in chosen}
    out = PeerResults()
    out.versions = {p.name: installed_versions(pythons[p.name], VERSIONS[p.name]) for p in chosen}
    order = [
        name for name in (TURNKEEP, *(p.name for p in PEERS)) if name == TURNKEEP or name in pythons
    ]
    if only is not None and TURNKEEP not in only:
        order.remove(TURNKEEP)
    by_name = {p.name: p for p in PEERS}
    fake = TimedFakeApi(respond=respond)
    with fake:
        async with turnkeep_runner(env, fake, max(iterations)) as run_turnkeep:
            for round_ in range(rounds):
                shift = round_ % len(order)
                for name in order[shift:] + order[:shift]:
                    progress(f"peers: round {round_ + 1}/{rounds}, {name}, K={iterations}")
                    if name == TURNKEEP:
                        outcome = Outcome()
                        for k in iterations:
                            before = fake.snapshot()
                            outcome.seconds[k] = await run_turnkeep(k)
                            fake_share(outcome, before, fake.snapshot(), k)
                    else:
                        peer = by_name[name]
                        outcome = run_peer(peer, pythons[name], fake, env.info.address, iterations)
                    out.rounds.setdefault(name, []).append(outcome)
                    progress(f"peers: {name}: {_progress_line(outcome)}")
    return table(out, iterations, rounds)


def _progress_line(outcome: Outcome) -> str:
    """A round's figures as they come (a long run's partial results are in its log)."""
    done = [f"K={k} {s * 1000 / k:.1f} ms/iteration" for k, s in outcome.seconds.items()]
    failed = [f"K={k} failed: {e[:120]}" for k, e in outcome.errors.items()]
    return "; ".join(done + failed)


def _cell(results: PeerResults, peer: str, k: int) -> str:
    value = results.ms_per_iteration(peer, k)
    if value is None:
        error = results.error(peer, k)
        return f"failed ({error[:80]})" if error else "—"
    spread = results.spread(peer, k)
    return f"{value:.1f} ({spread[0]:.1f}–{spread[1]:.1f})" if spread else f"{value:.1f}"


def _difference(a: float | None, b: float | None) -> str:
    return f"{a - b:+.1f}" if a is not None and b is not None else "—"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a is not None and b else "—"


def table(results: PeerResults, iterations: list[int], rounds: int) -> Table:
    first = iterations[0]
    rest = iterations[1:]
    columns = [
        "ms per iteration",
        *(f"K={k}" for k in iterations),
        *(f"K={k} ÷ K={first}" for k in rest),
        "fake server CPU per request (ms)",
    ]
    out = Table("The peers' workload: K tool calls of 5 KB on a fake OpenAI server", columns)
    names = [TURNKEEP, *(p.name for p in PEERS)]
    for name in names:
        fake = [results.fake_ms(name, k) for k in iterations]
        out.add(
            LABELS[name],
            *(_cell(results, name, k) for k in iterations),
            *(
                _ratio(results.ms_per_iteration(name, k), results.ms_per_iteration(name, first))
                for k in rest
            ),
            " / ".join(f"{v:.2f}" if v is not None else "—" for v in fake),
        )
    blanks = [""] * (len(rest) + 1)
    less = [results.ms_less_clients(FLOOR, k) for k in iterations]
    out.add(
        "fast-agent less its per-request client set-up",
        *(f"{v:.1f}" if v is not None else "—" for v in less),
        *(_ratio(v, less[0]) for v in less[1:]),
        "",
    )
    durable = [p.name for p in PEERS if p.durable]
    best_row = ["turnkeep ÷ best durable peer"]
    price_row = ["durability's price (ms): turnkeep − fast-agent"]
    price_less_row = ["… − fast-agent less its client set-up"]
    for k, floor_less in zip(iterations, less, strict=True):
        peers_ms = [v for p in durable if (v := results.ms_per_iteration(p, k)) is not None]
        ours = results.ms_per_iteration(TURNKEEP, k)
        best_row.append(_ratio(ours, min(peers_ms)) if peers_ms else "—")
        floor = results.ms_per_iteration(FLOOR, k)
        price_row.append(_difference(ours, floor))
        price_less_row.append(_difference(ours, floor_less))
    out.add(*best_row, *blanks)
    out.add(*price_row, *blanks)
    out.add(*price_less_row, *blanks)
    odd = sorted(
        f"{LABELS[name]} K={k}: {n}"
        for name, outcomes in results.rounds.items()
        for o in outcomes
        for k, n in o.requests.items()
        if n != k + 1
    )
    out.notes.append(
        "Model requests per turn: K + 1 for every turn (K tool calls, then the answer)."
        if not odd
        else "Model requests per turn other than K + 1: " + "; ".join(odd) + "."
    )
    out.notes.append(
        f"Median of {rounds} rounds (min–max in brackets), the order of the four rotated each "
        "round; a turn from its start request to its result, after an untimed warm-up turn. "
        "turnkeep ÷ best durable peer: against the faster of the two Temporal peers at that K. "
        "Durability's price: turnkeep's ms per iteration minus fast-agent's; fast-agent makes a "
        "new OpenAI client (a new TLS context) for every model request, so its figure is also "
        "given less the time spent making them (measured in its turn). Fake server CPU: "
        f"its thread's CPU time per request (reading, parsing, answering), at each K "
        f"({', '.join(map(str, iterations))}). turnkeep's worker shares "
        "this process (and its GIL) with the fake server; the peers' workers are processes of "
        "their own."
        + (
            " Versions: "
            + "; ".join(f"{LABELS[name]}: {v}" for name, v in results.versions.items())
            + "."
            if results.versions
            else ""
        )
    )
    return out
