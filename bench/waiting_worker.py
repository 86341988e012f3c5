"""A turnkeep worker in a process of its own, for the approval and session benchmarks
(``bench.approvals``, ``bench.sessions``) to read its resident memory and its own
metrics::

    python -m bench.waiting_worker --address A --queue Q --config C --cache N --status F

It is built as ``turnkeep worker`` builds one, from the turnkeep.yaml ``--config``, with the
benchmarks' function tools (``bench.turns``), and caches at most ``--cache`` workflows.
Once polling, and then every 0.2 s, it writes to ``--status`` what the SDK's own metrics say
(the Core SDK's gauges, read from an in-memory metric buffer): the task slots in use per kind
of worker (``ActivityWorker``: activities running) and how many workflows its sticky cache
holds. It runs until SIGTERM.

With ``TURNKEEP_BENCH_TRACEMALLOC`` set (to a directory), each SIGUSR1 writes there the heap's
figures and the count of live objects by type (``heap-N.json``, N from 0): RSS, glibc malloc's
bytes in use (the Core SDK's Rust heap among them) and pymalloc's. Unless
``TURNKEEP_BENCH_TRACE_FRAMES`` is 0, it also writes a snapshot of the Python allocations made
since the first signal (``snapshot-N.tracemalloc``, 25 frames or that many), tracing started
by that first signal: traced from the start, the sandbox's imports slow down so much that
workflow tasks time out. ``bench.approvals`` takes one before and one with every turn
waiting and prints what grew (``python -m bench.waiting_worker --diff DIR 0 1 TURNS`` prints
it again). Tracing costs memory and time of its own: the RSS of a traced run is not the
worker's, and a few dozen turns are enough (with hundreds, workflow tasks time out); with
frames 0 the figures are the worker's own.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import gc
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from bench.turns import TOOLS
from turnkeep.client.connection import connect
from turnkeep.config.files import load_settings
from turnkeep.worker.build import build_worker, tune_garbage_collector

REPO = Path(__file__).resolve().parents[1]
# The Core SDK's gauges, under the SDK's default metric prefix.
SLOTS_USED = "temporal_worker_task_slots_used"
CACHED = "temporal_sticky_cache_size"
# A directory: the heap's figures and traced allocations on SIGUSR1 (the module's docstring).
TRACEMALLOC = "TURNKEEP_BENCH_TRACEMALLOC"
# Frames per traced allocation (default 25); 0: no tracing, only the heap's figures.
TRACE_FRAMES = "TURNKEEP_BENCH_TRACE_FRAMES"


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


def _snapshots_on_signal(directory: Path, frames: int) -> None:
    """Each SIGUSR1 writes the next snapshot of traced allocations (with ``frames`` > 0), then
    the heap's figures and live objects by type (``heap-N.json``, last: once it exists, the
    snapshot is complete)."""
    directory.mkdir(parents=True, exist_ok=True)
    numbers = itertools.count()

    def dump() -> None:
        n = next(numbers)
        if frames and not tracemalloc.is_tracing():
            tracemalloc.start(frames)
        gc.collect()
        types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(str(snapshot_path(directory, n)))
        heap = {"heap": heap_figures(), "objects": dict(types)}
        partial_file = directory / f"heap-{n}.tmp"
        partial_file.write_text(json.dumps(heap))
        partial_file.replace(heap_path(directory, n))  # never read half-written

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_figures() -> dict[str, int]:
    """Where the process's memory is: its RSS; what glibc's malloc hands out (the Core SDK's
    Rust heap, protobuf's arenas, Python's objects over 512 bytes); Python's small-object
    allocator (pymalloc: its arenas, and the bytes of the blocks in use in them)."""
    figures = {"rss": _rss()}
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except AttributeError:  # not glibc ≥ 2.33
        pass
    else:
        mallinfo2.restype = _MallInfo2
        info = mallinfo2()
        figures["malloc_in_use"] = info.uordblks + info.hblkhd
        figures["malloc_free"] = info.fordblks
    figures.update(_pymalloc())
    return figures


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _pymalloc() -> dict[str, int]:
    """pymalloc's own figures, which only ``sys._debugmallocstats`` prints (to C's stderr)."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    wanted = {
        "# arenas allocated current": "pymalloc_arenas",
        "# bytes in allocated blocks": "pymalloc_in_use",
        "# bytes in available blocks": "pymalloc_free_blocks",
    }
    figures = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name.strip() in wanted:
            figures[wanted[name.strip()]] = int(value.strip().replace(",", ""))
    if "pymalloc_arenas" in figures:
        figures["pymalloc_arenas"] *= 1 << 20  # bytes: 1 MiB arenas (Python 3.10+, 64-bit)
    return figures


def snapshot_path(directory: Path, n: int) -> Path:
    return directory / f"snapshot-{n}.tracemalloc"


def heap_path(directory: Path, n: int) -> Path:
    return directory / f"heap-{n}.json"


def diff(directory: Path, before: int, after: int, count: int, top: int = 25) -> str:
    """What grew between two snapshots, per waiting turn: the heap's figures, live objects by
    type and, if traced, Python allocations by file and by traceback."""
    old_heap = json.loads(heap_path(directory, before).read_text())
    new_heap = json.loads(heap_path(directory, after).read_text())
    lines = ["heap, KB per turn:"]
    for name, value in new_heap["heap"].items():
        grown = value - old_heap["heap"].get(name, 0)
        lines.append(f"  {grown / count / 1024:8.1f}  {name}")
    old_types, new_types = old_heap["objects"], new_heap["objects"]
    grown_types = sorted(((n - old_types.get(t, 0), t) for t, n in new_types.items()), reverse=True)
    lines.append(f"live objects (gc-tracked) by type (top {top}), per turn:")
    lines += [f"  {d / count:8.1f}  {t}" for d, t in grown_types[:top]]
    if not snapshot_path(directory, after).exists():
        return "\n".join(lines)
    filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
    old = tracemalloc.Snapshot.load(str(snapshot_path(directory, before))).filter_traces(filters)
    new = tracemalloc.Snapshot.load(str(snapshot_path(directory, after))).filter_traces(filters)
    by_file = new.compare_to(old, "filename")
    total = sum(s.size_diff for s in by_file)
    lines.append(f"traced Python allocations: {total / count / 1024:+.1f} KB per turn")
    lines.append(f"by file (top {top}), KB and blocks per turn:")
    for stat in by_file[:top]:
        size, blocks = stat.size_diff / count / 1024, stat.count_diff / count
        lines.append(f"  {size:7.2f}  {blocks:7.1f}  {stat.traceback[0].filename}")
    lines.append(f"by traceback (top {top}), KB and blocks per turn, innermost frame first:")
    for stat in new.compare_to(old, "traceback")[:top]:
        size, blocks = stat.size_diff / count / 1024, stat.count_diff / count
        lines.append(f"  {size:7.2f}  {blocks:7.1f}")
        lines += [f"           {f.filename}:{f.lineno}" for f in list(stat.traceback)[::-1][:8]]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    if trace := os.environ.get(TRACEMALLOC):
        _snapshots_on_signal(Path(trace), int(os.environ.get(TRACE_FRAMES, "25")))
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
        tune_garbage_collector()  # as `turnkeep worker` does
        while not stop.is_set():
            status.with_suffix(".tmp").write_text(json.dumps(gauges.read()))
            status.with_suffix(".tmp").replace(status)  # never read half-written
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--diff"]:  # --diff DIR BEFORE AFTER TURNS
        directory, before, after, turns = sys.argv[2:6]
        print(diff(Path(directory), int(before), int(after), int(turns)))
        sys.exit()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--cache", type=int, required=True)
    parser.add_argument("--status", required=True)
    asyncio.run(main(parser.parse_args()))
