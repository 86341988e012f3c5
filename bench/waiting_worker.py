"""A turnkeep worker in a process of its own, for the approval and session benchmarks
(``bench/approvals.py``, ``bench/sessions.py``) to read its resident memory and its own
metrics::

    python -m bench.waiting_worker --address A --queue Q --config C --cache N --status F

It is built as ``turnkeep worker`` builds one, from the turnkeep.yaml ``--config``, with the
benchmarks' function tools (``bench/turns.py``), and caches at most ``--cache`` workflows.
Once polling, and then every 0.2 s, it writes to ``--status`` what the SDK's own metrics say
(the Core SDK's gauges, read from an in-memory metric buffer): the task slots in use per kind
of worker (``ActivityWorker``: activities running) and how many workflows its sticky cache
holds. It runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from bench.turns import TOOLS
from turnkeep.worker.build import build_worker, freeze_startup_heap
from turnkeep.worker.config import load_settings
from turnkeep.worker.connection import connect

REPO = Path(__file__).resolve().parents[1]
# The Core SDK's gauges, under the SDK's default metric prefix.
SLOTS_USED = "temporal_worker_task_slots_used"
CACHED = "temporal_sticky_cache_size"


class Gauges:
    """The latest value of each gauge the buffer has reported, by name and attributes."""

    def __init__(self, buffer: MetricBuffer) -> None:
        self.buffer = buffer
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def read(self) -> dict[str, Any]:
        for update in self.buffer.retrieve_updates():
            key = (update.metric.name, _attributes(update.attributes))
            self.values[key] = float(update.value)
        slots = {
            dict(attrs).get("worker_type", "?"): value
            for (name, attrs), value in self.values.items()
            if name == SLOTS_USED
        }
        cached = [value for (name, _), value in self.values.items() if name == CACHED]
        return {"slots_used": slots, "cached_workflows": max(cached) if cached else None}


def _attributes(attributes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in attributes.items()))


class WorkerProcess:
    """A running ``bench.waiting_worker``: its pid (for its RSS) and what it last reported."""

    def __init__(self, pid: int, status: Path) -> None:
        self.pid = pid
        self.status = status

    def report(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.status.read_text()))
        except (OSError, ValueError):
            return None

    def slots_used(self, worker_type: str = "ActivityWorker") -> float | None:
        report = self.report()
        return None if report is None else report["slots_used"].get(worker_type)

    def cached_workflows(self) -> float | None:
        report = self.report()
        return None if report is None else report["cached_workflows"]


@contextlib.contextmanager
def worker_process(
    address: str, namespace: str, queue: str, config: Path, cache: int, directory: Path
) -> Iterator[WorkerProcess]:
    """``bench.waiting_worker`` on ``queue``, stopped (SIGTERM, then SIGKILL) on exit. Wait for
    ``report()`` to be other than None before using it: the worker is polling then."""
    status = directory / f"{queue}-status.json"
    argv = [sys.executable, "-m", "bench.waiting_worker", "--address", address]
    argv += ["--namespace", namespace, "--queue", queue, "--config", str(config)]
    argv += ["--cache", str(cache), "--status", str(status)]
    with (directory / f"{queue}.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield WorkerProcess(proc.pid, status)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def main(args: argparse.Namespace) -> None:
    # Before any client exists: every client and worker of this process reports into it.
    buffer = MetricBuffer(100_000)
    Runtime.set_default(Runtime(telemetry=TelemetryConfig(metrics=buffer)))
    gauges = Gauges(buffer)
    settings = load_settings(Path(args.config))
    client = await connect(args.address, args.namespace, settings=settings)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    status = Path(args.status)
    worker = build_worker(
        client,
        settings,
        function_tools=TOOLS,
        task_queue=args.queue,
        max_cached_workflows=args.cache,
    )
    async with worker:
        freeze_startup_heap()  # as `turnkeep worker` does
        while not stop.is_set():
            status.with_suffix(".tmp").write_text(json.dumps(gauges.read()))
            status.with_suffix(".tmp").replace(status)  # never read half-written
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--cache", type=int, required=True)
    parser.add_argument("--status", required=True)
    asyncio.run(main(parser.parse_args()))
