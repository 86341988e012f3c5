"""Live streaming (issue #26), on the embedded dev server: how long a token takes from the
provider to a watcher, and what streaming costs the worker per token.

- First-token latency: the fake Anthropic API (real SDK, server-sent events, loopback) sends
  a turn's answer after a time to first token of ``TTFT`` seconds, ``TOKENS`` chunks
  ``CHUNK_DELAY`` apart; a watcher (``TurnHandle.stream()``, in this process) notes when the
  first ``TextDelta`` reaches it. Latency: that instant minus the instant the fake API wrote
  the first text chunk (one monotonic clock: everything runs in this process). Turns run one
  at a time; p50/p95 over ``--turns``.
- CPU per streamed token: this process's CPU time (worker, watcher, the Temporal SDK's
  threads; the fake API's thread is subtracted) for the same turns streamed, watched by
  ``stream()``, minus unstreamed (no ``streaming:``), watched by ``messages()``, divided by
  the tokens streamed; and the worker's own share: the same streamed turns watched by
  ``messages()`` only (the SDK's streaming, the live channel; no SSE client, no decoding).

    .venv/bin/python -m bench.live_stream [--turns 20]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.report import Table, progress
from turnkeep.client.connection import connect
from turnkeep.client.live import TextDelta
from turnkeep.client.turns import start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.turn_io import TurnInput
from turnkeep.devserver.embedded import EmbeddedServer, ServerInfo
from turnkeep.testing.fake_api import Answer, FakeModelApi, Reply
from turnkeep.worker.build import build_worker

TOKENS = 50
CHUNK_DELAY = 0.005
TTFT = 0.3  # a real API's time to first token is longer: this is the hard case for discovery
TARGET_P95_MS = 100.0


def _settings(fake: FakeModelApi, tmp: Path, streaming: bool, payloads: Path | None) -> Settings:
    config: dict[str, Any] = {
        "anthropic": {"api_key": "bench", "base_url": fake.base_url_anthropic},
        "agents": {"live": {"model": "anthropic.bench-model"}},
        "base_dir": tmp,
    }
    if payloads is not None:  # the client's own storage, which the worker must share
        config["payload_storage"] = {"path": str(payloads)}
    if streaming:
        config["streaming"] = {"listen": "127.0.0.1:0"}
    return Settings.model_validate(config)


def _fake_cpu(fake: FakeModelApi) -> float:
    thread = fake._thread  # the fake API's own thread, whose CPU is not the worker's
    if thread is None or thread.ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


async def _turns(
    client: Client,
    fake: FakeModelApi,
    tmp: Path,
    turns: int,
    *,
    streaming: bool,
    watch_live: bool = True,
    payloads: Path | None = None,
) -> tuple[list[float], float]:
    """(first-token latencies in seconds, CPU seconds) for ``turns`` turns, one at a time."""
    queue = f"bench-live-{uuid.uuid4().hex[:8]}"
    text = " ".join(f"token{i}" for i in range(TOKENS))
    latencies: list[float] = []
    async with build_worker(client, _settings(fake, tmp, streaming, payloads), task_queue=queue):
        # One turn first, outside the figures: SDK imports, the live server's start.
        for warm in (True, *([False] * turns)):
            answer = Answer(text=text, chunk_delay=CHUNK_DELAY, sent=[])
            fake.script(Reply.delay(TTFT, then=answer), api="anthropic")
            cpu = time.process_time() - _fake_cpu(fake)
            handle = await start_turn(
                client, TurnInput(agent="live", messages=["go"]), task_queue=queue
            )
            first: float | None = None
            if streaming and watch_live:
                async for event in handle.stream():
                    if first is None and isinstance(event, TextDelta):
                        first = time.monotonic()
            else:
                async for _ in handle.messages():
                    pass
            await handle.result()
            if warm:
                spent = 0.0
                continue
            spent += time.process_time() - _fake_cpu(fake) - cpu
            if streaming and watch_live:
                if first is None or not answer.sent:
                    raise RuntimeError("a streamed turn showed no live text")
                latencies.append(first - answer.sent[0])
    return latencies, spent


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def live_stream(client: Client, turns: int, payloads: Path | None = None) -> Table:
    """``payloads``: the payload storage directory ``client`` was connected with (None: the
    default one)."""
    with tempfile.TemporaryDirectory(prefix="turnkeep-live-") as name, FakeModelApi() as fake:
        tmp = Path(name)
        progress(f"live streaming: {turns} streamed turns, {turns} unstreamed")
        run = functools.partial(_turns, client, fake, tmp, turns, payloads=payloads)
        latencies, streamed_cpu = await run(streaming=True)
        _, unwatched_cpu = await run(streaming=True, watch_live=False)
        _, plain_cpu = await run(streaming=False)
    p50, p95 = (_percentile(latencies, p) * 1000 for p in (50, 95))
    per_token_us = (streamed_cpu - plain_cpu) / (turns * TOKENS) * 1e6
    worker_us = (unwatched_cpu - plain_cpu) / (turns * TOKENS) * 1e6
    table = Table(
        "Live streaming (issue #26)",
        ["measure", "value", "target"],
    )
    ok = "met" if p95 <= TARGET_P95_MS else "NOT met"
    table.add(
        "first token, provider → watcher",
        f"p50 {p50:.1f} ms · p95 {p95:.1f} ms · max {max(latencies) * 1000:.1f} ms",
        f"p95 ≤ {TARGET_P95_MS:.0f} ms: {ok}",
    )
    table.add(
        "worker CPU per streamed token (nobody watching live)",
        f"{worker_us:.0f} µs ({unwatched_cpu / turns * 1000:.0f} ms vs "
        f"{plain_cpu / turns * 1000:.0f} ms unstreamed per turn)",
        "",
    )
    table.add(
        "CPU per streamed token (worker + live watcher)",
        f"{per_token_us:.0f} µs ({streamed_cpu / turns * 1000:.0f} ms streamed vs "
        f"{plain_cpu / turns * 1000:.0f} ms unstreamed per turn of {TOKENS} tokens)",
        "",
    )
    table.notes.append(
        f"{turns} turns each of three ways, one at a time; the fake Anthropic API answers after "
        f"{TTFT * 1000:.0f} ms with {TOKENS} chunks {CHUNK_DELAY * 1000:.0f} ms apart; worker, "
        "watcher and fake API share this process (the fake API's thread CPU is excluded)."
    )
    return table


async def _main(turns: int) -> None:
    with tempfile.TemporaryDirectory(prefix="turnkeep-live-server-") as _:
        async with EmbeddedServer(ui=False) as info:
            client = await _client(info)
            print((await live_stream(client, turns)).render())


async def _client(info: ServerInfo) -> Client:
    return await connect(info.address, info.namespace)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.live_stream")
    parser.add_argument("--turns", type=int, default=20)
    asyncio.run(_main(parser.parse_args().turns))


if __name__ == "__main__":
    main()
