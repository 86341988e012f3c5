"""The HTTP gateway (issue #34), on the embedded dev server: what it adds to starting a turn,
and how it fans one turn's events out to many watchers.

- Start: ``POST /api/turns`` to a ``turnkeep gateway`` process (HTTP on loopback, key check,
  validation, then ``start_turn``) against ``start_turn`` called here directly, alternately;
  p50 of each and the difference. The turns are of an agent no worker polls (only the start is
  timed), terminated afterwards.
- Fan-out: ``--watchers`` SSE watchers of one turn, all connected to the one gateway process
  (which follows the turn once), while a direct ``TurnHandle.stream()`` watches it here. The
  turn's first model call asks for a tool that waits until every watcher is connected and has
  the first messages; the second answers after ``TTFT`` with ``TOKENS`` chunks. Memory per
  watcher: the gateway process's RSS with every watcher connected (and its peak while
  streaming) minus before, over the watchers. First-token latency: when a watcher's first
  ``text`` event arrived minus when the fake API wrote the first chunk (one clock: watchers,
  fake API and worker share this process), p95 over every watcher of every turn, against the
  direct stream's.

    .venv/bin/python -m bench.gateway [--watchers 1000] [--turns 2] [--starts 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx2
import yaml
from temporalio.client import Client

from bench.report import Table, progress
from turnkeep.client.connection import connect
from turnkeep.client.live import TextDelta
from turnkeep.client.turns import get_turn, start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.turn_io import TurnInput, agent_task_queue
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.support.asgi import bind
from turnkeep.testing.fake_api import Answer, FakeModelApi, Reply
from turnkeep.worker.build import build_workers

KEY = "bench-gateway-key-0123456789abcdef"
TOKENS = 50
CHUNK_DELAY = 0.005
TTFT = 0.3  # as bench.live_stream: the follower finds the model call while it waits for it
START_TARGET_MS = 5.0
LATENCY_TARGET_MS = 50.0

_gate = asyncio.Event()


async def hold() -> str:
    """Waits until every watcher is connected."""
    await _gate.wait()
    return "everyone is here"


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Watch:
    """What one SSE watcher received: the stream's bytes, and when its first text came."""

    body: bytearray = field(default_factory=bytearray)
    first_text: float | None = None

    @property
    def messages(self) -> int:
        return self.body.count(b"event: message")

    @property
    def ended(self) -> bool:
        return b"event: end" in self.body


async def _watch(port: int, path: str, seen: Watch) -> None:
    """A watcher as lean as a client can be (HTTP/1.0 over a socket, the frames kept as they
    come), so what is measured is the gateway rather than the watchers' own parsing: a
    thousand SSE parsers in one process would be slower than the server they read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET {path} HTTP/1.0\r\nHost: bench\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"a watcher got {head.splitlines()[0]!r}")
        while chunk := await reader.read(65536):
            if seen.first_text is None and b"event: text" in chunk:
                seen.first_text = time.monotonic()
            seen.body += chunk
    finally:
        writer.close()


def _spawn(*args: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "turnkeep.cli", "gateway", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


@contextlib.asynccontextmanager
async def _gateway_process(
    info: ServerInfo, tmp: Path, base_queue: str, payloads: Path | None
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    config: dict[str, Any] = {
        "task_queue": base_queue,
        "agents": {"live": {"model": "passthrough"}, "idle": {"model": "passthrough"}},
        "gateway": {
            "keys": {"bench": {"key": KEY, "agents": ["*"]}},
            "rate_limit": {"per_second": 1_000_000, "burst": 1_000_000},
            "max_watchers": 100_000,
        },
    }
    if payloads is not None:
        config["payload_storage"] = {"path": str(payloads)}
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    log = (tmp / "gateway.log").open("wb")
    process = _spawn(
        "--config",
        str(path),
        "--address",
        info.address,
        "--namespace",
        info.namespace,
        "--no-worker",
        "--listen",
        f"127.0.0.1:{port}",
        log=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx2.AsyncClient(trust_env=False) as http:
            for _ in range(300):
                with contextlib.suppress(httpx2.TransportError):
                    if (await http.get(f"{url}/openapi.json")).status_code == 200:
                        break
                if process.poll() is not None:
                    raise RuntimeError(f"the gateway exited: {(tmp / 'gateway.log').read_text()}")
                await asyncio.sleep(0.1)
        yield process, url
    finally:
        process.terminate()
        process.wait(10)
        log.close()


async def _starts(
    client: Client, http: httpx2.AsyncClient, base_queue: str, starts: int
) -> tuple[list[float], list[float]]:
    """(direct, through the gateway) start times in seconds, alternately, after a warm-up."""
    queue = agent_task_queue(base_queue, "idle")
    direct: list[float] = []
    gateway: list[float] = []
    started: list[str] = []
    headers = {"authorization": f"Bearer {KEY}"}
    for i in range(starts + 3):
        t0 = time.perf_counter()
        handle = await start_turn(
            client, TurnInput(agent="idle", messages=["go"]), task_queue=queue
        )  # type: ignore[list-item]
        t1 = time.perf_counter()
        answer = await http.post(
            "/api/turns", json={"agent": "idle", "prompt": "go"}, headers=headers
        )
        t2 = time.perf_counter()
        if answer.status_code != 201:
            raise RuntimeError(f"the gateway answered {answer.status_code}: {answer.text}")
        started += [handle.workflow_id, answer.json()["turn_id"]]
        if i >= 3:
            direct.append(t1 - t0)
            gateway.append(t2 - t1)
    for turn_id in started:
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(turn_id).terminate("benchmark done")
    return direct, gateway


@dataclass
class FanOut:
    watchers: int
    rss_before_kb: int
    rss_connected_kb: int
    rss_peak_kb: int
    latencies: list[float]
    direct: float
    all_same: bool
    all_ended: bool
    events: int


async def _fan_out(
    client: Client,
    http: httpx2.AsyncClient,
    fake: FakeModelApi,
    pid: int,
    watchers: int,
) -> FanOut:
    port = http.base_url.port
    assert port is not None
    text = " ".join(f"token{i}" for i in range(TOKENS))
    answer = Answer(text=text, chunk_delay=CHUNK_DELAY, sent=[])
    fake.script(
        Answer(calls=(("c1", "wait__hold", {}),)), Reply.delay(TTFT, then=answer), api="anthropic"
    )
    _gate.clear()
    rss_before = _rss_kb(pid)
    started = await http.post(
        "/api/turns",
        json={"agent": "live", "prompt": "go"},
        headers={"authorization": f"Bearer {KEY}"},
    )
    turn_id = started.json()["turn_id"]
    direct_first: list[float] = []

    async def direct() -> None:
        async for event in get_turn(client, turn_id).stream():
            if isinstance(event, TextDelta) and not direct_first:
                direct_first.append(time.monotonic())

    seen = [Watch() for _ in range(watchers)]
    path = f"/api/turns/{turn_id}/events"
    tasks = [asyncio.ensure_future(_watch(port, path, s)) for s in seen]
    direct_task = asyncio.ensure_future(direct())
    # Every watcher has the prompt and the tool call: all connected, before any text.
    deadline = time.monotonic() + 120
    while sum(s.messages >= 2 for s in seen) < watchers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {sum(s.messages >= 2 for s in seen)} watchers connected")
        for task in tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        await asyncio.sleep(0.05)
    rss_connected = _rss_kb(pid)
    peak = rss_connected
    _gate.set()
    while not all(t.done() for t in tasks):
        peak = max(peak, _rss_kb(pid))
        await asyncio.sleep(0.02)
    await asyncio.gather(*tasks, direct_task)
    if not answer.sent or not direct_first:
        raise RuntimeError("the turn streamed no text")
    sent = answer.sent[0]
    digests = {hashlib.sha256(s.body).hexdigest() for s in seen}
    return FanOut(
        watchers=watchers,
        rss_before_kb=rss_before,
        rss_connected_kb=rss_connected,
        rss_peak_kb=peak,
        latencies=[s.first_text - sent for s in seen if s.first_text is not None],
        direct=direct_first[0] - sent,
        all_same=len(digests) == 1,
        all_ended=all(s.ended for s in seen),
        events=seen[0].body.count(b"\r\n\r\n"),
    )


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, needed))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


async def gateway_bench(
    client: Client,
    info: ServerInfo,
    *,
    watchers: int,
    turns: int,
    starts: int,
    payloads: Path | None = None,
) -> Table:
    _raise_fd_limit(watchers * 2 + 512)  # inherited by the gateway process
    base_queue = f"bench-gw-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="turnkeep-gateway-") as name, FakeModelApi() as fake:
        tmp = Path(name)
        worker_config: dict[str, Any] = {
            "anthropic": {"api_key": "bench", "base_url": fake.base_url_anthropic},
            "agents": {"live": {"model": "anthropic.bench-model", "servers": ["wait"]}},
            "streaming": {"listen": "127.0.0.1:0"},
            "base_dir": tmp,
        }
        if payloads is not None:
            worker_config["payload_storage"] = {"path": str(payloads)}
        settings = Settings.model_validate(worker_config)
        workers = build_workers(
            client, settings, task_queue=base_queue, function_tools={"wait": [hold]}
        )
        progress(f"gateway: {starts} starts each way, {turns} turns × {watchers} SSE watchers")
        async with workers, _gateway_process(info, tmp, base_queue, payloads) as (process, url):
            limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
            async with httpx2.AsyncClient(
                base_url=url, trust_env=False, timeout=httpx2.Timeout(120), limits=limits
            ) as http:
                direct, through = await _starts(client, http, base_queue, starts)
                runs = [
                    await _fan_out(client, http, fake, process.pid, watchers) for _ in range(turns)
                ]
    return _table(direct, through, runs)


def _table(direct: list[float], through: list[float], runs: list[FanOut]) -> Table:
    table = Table("HTTP gateway (issue #34)", ["measure", "value", "target"])
    d50, g50 = _percentile(direct, 50) * 1000, _percentile(through, 50) * 1000
    table.add(
        "start a turn: gateway vs start_turn, p50",
        f"{g50:.1f} ms vs {d50:.1f} ms: +{g50 - d50:.1f} ms",
        f"≤ +{START_TARGET_MS:.0f} ms: {'met' if g50 - d50 <= START_TARGET_MS else 'NOT met'}",
    )
    latencies = [lat for run in runs for lat in run.latencies]
    p95 = _percentile(latencies, 95) * 1000
    direct_p95 = _percentile([run.direct for run in runs], 95) * 1000
    over = p95 - direct_p95
    spread = [lat - min(run.latencies) for run in runs for lat in run.latencies]
    table.add(
        "first token: each watcher after the turn's first watcher (the fan-out itself)",
        f"p50 {_percentile(spread, 50) * 1000:.1f} ms · p95 {_percentile(spread, 95) * 1000:.1f} "
        f"ms · max {max(spread) * 1000:.1f} ms",
        "",
    )
    table.add(
        f"first token, {runs[0].watchers} SSE watchers vs the direct stream",
        f"p50 {_percentile(latencies, 50) * 1000:.1f} ms · p95 {p95:.1f} ms vs direct "
        f"{direct_p95:.1f} ms: +{over:.1f} ms",
        f"≤ +{LATENCY_TARGET_MS:.0f} ms: {'met' if over <= LATENCY_TARGET_MS else 'NOT met'}",
    )
    for i, run in enumerate(runs, 1):
        connected = (run.rss_connected_kb - run.rss_before_kb) / run.watchers
        peak = (run.rss_peak_kb - run.rss_before_kb) / run.watchers
        table.add(
            f"turn {i}: gateway memory per watcher",
            f"{connected:.1f} KB connected · {peak:.1f} KB at the peak "
            f"(RSS {run.rss_before_kb / 1024:.0f} → {run.rss_peak_kb / 1024:.0f} MB)",
            "",
        )
        table.add(
            f"turn {i}: every watcher got every event",
            f"{'yes' if run.all_same and run.all_ended else 'NO'} "
            f"({run.events} events each, identical: {run.all_same}, all ended: {run.all_ended})",
            "",
        )
    table.notes.append(
        "The gateway is a `turnkeep gateway` process of its own; the watchers (raw sockets "
        "reading HTTP/1.0 streams), the worker, the fake API and the direct watcher share "
        "this process, so the watchers' own reading counts in their latency. Start times "
        "alternate one each way. The direct stream is one follower in this process: its "
        "first token depends on when its look for the model call falls, as the gateway's "
        "single follower's does."
    )
    return table


async def _main(args: argparse.Namespace) -> None:
    async with EmbeddedServer(ui=False) as info:
        client = await connect(info.address, info.namespace)
        table = await gateway_bench(
            client, info, watchers=args.watchers, turns=args.turns, starts=args.starts
        )
        print(table.render())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway")
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--starts", type=int, default=30)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
