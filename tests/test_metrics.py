"""Prometheus metrics (issue 24): a worker on a Temporal runtime serving Prometheus on a free
loopback port, real turns on the dev server through the real Anthropic SDK and the fake API
(a tool call, a tool that fails, a model error that is retried, a call awaiting approval,
a payload stored externally), then a scrape of the endpoint, checked value by value; and the
SDK's cache gauge, as turns waiting for people and idle sessions leave the worker's cache."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.conftest import eventually, make_settings, write_script
from turnkeep import SessionHandle, TurnInput, build_worker, open_session, start_turn
from turnkeep.client.plugin import TurnkeepClientPlugin
from turnkeep.client.turns import get_turn
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.observability.setup import metrics_runtime
from turnkeep.testing.fake_api import FakeModelApi, Reply, Tokens
from turnkeep.workflows.metrics import CATALOGUE, MetricKind

pytestmark = pytest.mark.asyncio

Labels = dict[str, str]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"boom: {reason}")


def big(size: int, seed: str) -> str:
    """A long text."""
    return seed + "x" * size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scrape:
    """One scrape of /metrics: samples by name, each with its labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: list[tuple[str, Labels, float]] = []
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            name, _, rest = head.partition("{")
            pairs = (p.partition("=") for p in rest.rstrip("}").split('",') if p)
            labels = {k: v.strip('"') for k, _, v in pairs}
            self.samples.append((name, labels, float(value)))

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        return sum(
            v
            for n, have, v in self.samples
            if n == name and all(have.get(k) == want for k, want in labels.items())
        )

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}


@pytest.fixture(scope="module")
async def metered(temporal: ServerInfo) -> AsyncIterator[tuple[Client, str]]:
    """A client on a runtime serving Prometheus, and the endpoint's URL."""
    address = f"127.0.0.1:{free_port()}"
    runtime = metrics_runtime(address)
    # As `turnkeep worker` connects: turnkeep's client plugin, on the runtime serving metrics.
    client = await Client.connect(
        temporal.address,
        namespace=temporal.namespace,
        runtime=runtime,
        plugins=[TurnkeepClientPlugin()],
    )
    yield client, f"http://{address}/metrics"


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=10) as response:
        return Scrape(response.read().decode())


def settings_for(fake: FakeModelApi) -> dict[str, Any]:
    llm = {"start_to_close": 30, "heartbeat": 5, "max_attempts": 3}
    agent = {
        "model": "anthropic.test-model",
        "servers": ["math"],
        "llm_timeouts": llm,
        "tool_timeouts": {"start_to_close": 30, "heartbeat": 5, "max_attempts": 1},
    }
    return {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        # The gated agent's model is priced, the other's is not: both cost metrics are counted.
        "prices": {"anthropic.priced-model": {"input": 1, "output": 1}},
        # The gated agent's model has a limit: its waits and the limiter's use are measured.
        "limits": {"anthropic.priced-model": {"requests_per_minute": 600}},
        "agents": {
            "metered": agent,
            "gated": {
                **agent,
                "model": "anthropic.priced-model",
                "approval": {"tools": ["math__add"], "timeout": "1h"},
            },
        },
    }


async def test_turns_model_calls_tools_tokens_and_approvals_are_counted(
    metered: tuple[Client, str], client: Client, fake: FakeModelApi, tmp_path: Path
) -> None:
    worker_client, url = metered
    settings = make_settings(tmp_path, **settings_for(fake))
    queue = f"metrics-{uuid.uuid4().hex[:10]}"
    tools: dict[str, list[Callable[..., Any]]] = {"math": [add, explode, big]}
    worker = build_worker(worker_client, settings, function_tools=tools, task_queue=queue)

    async def run(agent: str, prompt: str) -> Any:
        turn = TurnInput(agent=agent, messages=[prompt])
        return await start_turn(client, turn, task_queue=queue)

    fake.script(
        # Turn 1: a tool call, a failing tool and a large result (stored externally).
        Reply.tool_calls(
            ("c1", "math__add", {"a": 2, "b": 3}),
            ("c2", "math__explode", {"reason": "test"}),
            # New content each run: stored content is not written (or counted) again.
            ("c3", "math__big", {"size": 300_000, "seed": uuid.uuid4().hex}),
            usage=Tokens(input=100, output=10),
        ),
        Reply.text("5", usage=Tokens(input=120, output=8, cache_read=30, cache_write=7)),
        # Turn 2: the model fails once (retryable), then answers.
        Reply.error(529, "overloaded"),
        Reply.text("fine", usage=Tokens(input=50, output=4)),
        api="anthropic",
    )
    async with worker:
        first = await (await run("metered", "add")).result()
        second = await (await run("metered", "hello")).result()
        assert first.final is not None and first.final.text == "5"
        assert second.final is not None and second.final.text == "fine"

        fake.script(
            Reply.tool_calls(("g1", "math__add", {"a": 1, "b": 1}), usage=Tokens(20, 2)),
            Reply.text("2", usage=Tokens(30, 3)),
            api="anthropic",
        )
        gated = await run("gated", "add, carefully")
        await eventually(gated.pending_approvals, "g1 awaits approval")
        waiting = scrape(url)
        await gated.decide("g1", True, by="alice")
        await gated.result()
        after = scrape(url)

    # While g1 waited: one call awaiting approval (requested minus resolved).
    assert waiting.value("turnkeep_approvals_requested", agent="gated") == 1
    assert waiting.value("turnkeep_approvals_resolved", agent="gated") == 0
    assert after.value("turnkeep_approvals_resolved", agent="gated", decision="approve") == 1

    assert after.value("turnkeep_turns_started", agent="metered", task_queue=queue) == 2
    assert after.value("turnkeep_turns_ended", agent="metered", stop_reason="endTurn") == 2
    assert after.value("turnkeep_turns_ended", agent="gated", stop_reason="endTurn") == 1
    # Iterations per turn: 1 and 0 for `metered`.
    assert after.value("turnkeep_turn_iterations_count", agent="metered") == 2
    assert after.value("turnkeep_turn_iterations_sum", agent="metered") == 1
    assert after.value("turnkeep_turn_iterations_bucket", agent="metered", le="0") == 1

    # Tokens: exactly what the fake API reported, by kind (the gated turn's under its model).
    model = {"model": "anthropic.test-model"}
    priced = {"model": "anthropic.priced-model"}
    assert after.value("turnkeep_tokens", kind="input", **model) == 100 + 120 + 50
    assert after.value("turnkeep_tokens", kind="output", **model) == 10 + 8 + 4
    assert after.value("turnkeep_tokens", kind="cache_read", **model) == 30
    assert after.value("turnkeep_tokens", kind="cache_write", **model) == 7
    assert after.value("turnkeep_tokens", kind="input", **priced) == 20 + 30

    # Cost: the priced model's at $1 per million tokens; the other's calls are unpriced.
    assert after.value("turnkeep_cost_micro_usd", **priced) == 20 + 30 + 2 + 3
    assert after.value("turnkeep_unpriced_model_calls", **model) == 3

    # Model calls: 4 attempts, one of which failed with the provider error's class.
    assert after.value("turnkeep_model_call_latency_count", **model) == 4
    assert after.value("turnkeep_model_call_errors", error="ProviderOverloaded", **model) == 1
    assert after.value("turnkeep_model_call_errors", **model) == 1
    # The 529 as a provider's rate limit; the limited model's two calls waited (or not) once each.
    rate_limited = after.value("turnkeep_provider_rate_limited", provider="anthropic", **model)
    assert rate_limited == 1
    limit = {"limit": "anthropic.priced-model"}
    assert after.value("turnkeep_limit_wait_seconds_count", priority="normal", **limit) == 2
    assert after.value("turnkeep_limit_requests_in_use", **limit) >= 1

    # Tool calls by tool; only the failing one counted as an error.
    assert after.value("turnkeep_tool_call_latency_count", tool="math__add") == 2
    assert after.value("turnkeep_tool_call_latency_count", tool="math__explode") == 1
    assert after.value("turnkeep_tool_call_errors", tool="math__explode") == 1
    assert after.value("turnkeep_tool_call_errors", tool="math__add") == 0
    # The 300 KB result went to payload storage, and at least that many bytes were written.
    assert after.value("turnkeep_payload_bytes_stored", driver="local") >= 300_000

    # The SDK's own metrics are served too, beside turnkeep's.
    names = after.names()
    assert "temporal_workflow_completed" in names
    assert "temporal_activity_execution_latency_bucket" in names
    # Every catalogue entry is exposed under its catalogued name.
    for spec in CATALOGUE:
        scraped = spec.name + ("_count" if spec.kind == MetricKind.HISTOGRAM else "")
        assert scraped in names, spec.name


async def test_turnkeep_worker_serves_metrics_from_its_config(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    """`turnkeep worker` with `observability.metrics`: the endpoint comes up with the SDK's
    metrics of the polling worker."""
    port = free_port()
    (tmp_path / "turnkeep.yaml").write_text(
        f'task_queue: metrics-cli\nobservability:\n  metrics: "127.0.0.1:{port}"\n',
        encoding="utf-8",
    )
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.address}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turnkeep.cli",
        "worker",
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )

    def polling() -> Scrape | None:
        try:
            found = scrape(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            return None
        return found if found.value("temporal_num_pollers", task_queue="metrics-cli") else None

    try:
        found = await eventually(polling, "the worker's metrics show it polling", within=90)
        assert "temporal_worker_task_slots_available" in found.names()
    finally:
        process.terminate()
        output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    assert f"metrics at http://127.0.0.1:{port}/metrics" in output.decode()


# Slow: a worker process of its own can take tens of seconds to start on a loaded machine.
@pytest.mark.slow
async def test_a_bounded_workflow_cache_lets_idle_sessions_go_and_brings_them_back(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    """`worker.max_cached_workflows` bounds what idle sessions cost the worker: past it, the
    least recently used leaves the cache, and is replayed from history when a message comes."""
    port, queue = free_port(), f"cache-{uuid.uuid4().hex[:10]}"
    config = {
        "task_queue": queue,
        "worker": {"max_cached_workflows": 2},
        "observability": {"metrics": f"127.0.0.1:{port}"},
        "agents": {"chat": {"model": "passthrough"}},
    }
    (tmp_path / "turnkeep.yaml").write_text(json.dumps(config), encoding="utf-8")
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.address}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "turnkeep.cli", "worker", cwd=tmp_path, env=env
    )

    async def one_turn(session: SessionHandle, text: str) -> list[str]:
        sent = await session.send(text)
        return [m.text async for m in session.messages(2 * (sent.turn - 1), until_turn=sent.turn)]

    try:
        sessions = [await open_session(client, agent="chat", task_queue=queue) for _ in range(4)]
        for n, session in enumerate(sessions):
            assert await one_turn(session, f"hello {n}") == [f"hello {n}"] * 2

        def cached() -> float | None:
            try:
                found = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                return None
            return found.value("temporal_sticky_cache_size") if found.samples else None

        # Four idle sessions (and their ended turns), two cached at most.
        assert 0 < await eventually(cached, "the cache gauge") <= 2
        # The least recently used session left the cache; a message brings it back whole.
        assert await one_turn(sessions[0], "again") == ["again"] * 2
        turn = await get_turn(client, f"{sessions[0].session_id}/turn-2").result()
        assert [m.text for m in turn.history] == ["hello 0", "hello 0", "again", "again"]
        for session in sessions:
            await session.close()
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=60)


async def test_a_turn_waiting_only_for_people_leaves_the_worker_cache(
    metered: tuple[Client, str], client: Client, tmp_path: Path
) -> None:
    """While a call of the batch still runs the turn stays cached; once only a person is
    awaited it leaves the worker's cache (its gauge says so), a query does not keep it there,
    and the decision replays it."""
    worker_client, url = metered
    released, read = asyncio.Event(), []

    async def look(name: str) -> str:
        """Reads ``name``, once the test lets it."""
        await released.wait()
        read.append(name)
        return f"read {name}"

    def write(text: str) -> str:
        """Writes ``text``."""
        return f"wrote {text}"

    calls = {
        "w1": {"name": "fs__write", "arguments": {"text": "draft"}},
        "r1": {"name": "fs__look", "arguments": {"name": "notes"}},
    }
    script = write_script(tmp_path / "script.json", {"tool_calls": calls}, "Done.")
    agent = {"model": "playback", "playback": str(script), "servers": ["fs"]}
    agent["approval"] = {"tools": ["fs__write"], "timeout": "1h"}
    settings = make_settings(tmp_path, agents={"gated": agent})
    queue = f"metrics-{uuid.uuid4().hex[:10]}"
    tools: dict[str, list[Callable[..., Any]]] = {"fs": [write, look]}

    def cached() -> float:
        return scrape(url).value("temporal_sticky_cache_size", task_queue=queue)

    async with build_worker(worker_client, settings, function_tools=tools, task_queue=queue):
        turn = await start_turn(client, TurnInput(agent="gated", messages=["go"]), task_queue=queue)
        await eventually(turn.pending_approvals, "w1 awaits approval")
        # The read still runs: the turn has work of its own in flight, and stays.
        assert await eventually(cached, "the turn in the cache") == 1
        released.set()
        await eventually(lambda: read == ["notes"], "the read ran")
        await eventually(lambda: cached() == 0, "the turn out of the cache")
        # A query brings it back to answer (replayed from history), and it leaves again.
        [pending] = await turn.pending_approvals()
        assert pending.call_id == "w1"
        await eventually(lambda: cached() == 0, "the turn out of the cache after a query")
        await turn.decide("w1", True, by="alice")
        result = await turn.result()
    texts = [r.text for m in result.messages for r in (m.tool_results or {}).values()]
    assert sorted(texts) == ["read notes", "wrote draft"]
    assert result.final is not None and result.final.text == "Done."


async def test_an_idle_session_leaves_the_worker_cache_and_its_next_message_brings_it_back(
    metered: tuple[Client, str], client: Client, tmp_path: Path
) -> None:
    """A session with nothing to answer leaves the worker's cache `worker.idle_session_cache`
    after its turn (a query does not keep it there), and its next message replays it."""
    worker_client, url = metered
    config = {"worker": {"idle_session_cache": "5s"}, "agents": {"chat": {"model": "passthrough"}}}
    settings = make_settings(tmp_path, **config)
    queue = f"metrics-{uuid.uuid4().hex[:10]}"

    def cached() -> float:
        return scrape(url).value("temporal_sticky_cache_size", task_queue=queue)

    async def one_turn(session: SessionHandle, text: str) -> list[str]:
        sent = await session.send(text)
        return [m.text async for m in session.messages(2 * (sent.turn - 1), until_turn=sent.turn)]

    async with build_worker(worker_client, settings, task_queue=queue):
        session = await open_session(client, agent="chat", task_queue=queue)
        assert await one_turn(session, "hello") == ["hello"] * 2
        # Its turn has ended (and left); the session stays a while for the next line.
        await eventually(lambda: cached() == 1, "the session alone in the cache")
        await eventually(lambda: cached() == 0, "the idle session out of the cache")
        # A query brings it back to answer, and it leaves again.
        assert (await session.handle.query("progress")).get("turns_ended") == 1
        await eventually(lambda: cached() == 0, "the session out of the cache after a query")
        assert await one_turn(session, "again") == ["again"] * 2
        turn = await get_turn(client, f"{session.session_id}/turn-2").result()
        assert [m.text for m in turn.history] == ["hello", "hello", "again", "again"]
        await session.close()
