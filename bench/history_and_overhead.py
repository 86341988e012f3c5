"""Benchmark: workflow history growth and per-iteration loop overhead (not a test).

    .venv/bin/python -m bench.history_and_overhead [--iterations 5,20,50,100,200]

Everything is measured in one run on a freshly started embedded dev server:

- history bytes and events of a turn of K iterations (playback model, a tool returning 5 KB),
  next to the bytes of the conversation itself (the TurnResult's history as JSON);
- loop overhead: seconds per iteration of such a turn with an instant model and an instant
  tool, divided by the floor — a bare workflow awaiting the same number of no-op activities
  one after another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from activities.settings import Settings
from bench.floor import Floor, noop
from worker.build import build_worker
from worker.client import start_turn
from worker.connection import connect
from worker.embedded import EmbeddedServer
from workflows.turn_io import TurnInput

RESULT_BYTES = 5 * 1024


def blob(i: int) -> str:
    """Returns 5 KB of text."""
    return f"result {i}: " + "x" * RESULT_BYTES


def script(path: Path, iterations: int) -> Path:
    calls = [
        {"tool_calls": {f"c{i}": {"name": "local__blob", "arguments": {"i": i}}}}
        for i in range(iterations)
    ]
    path.write_text(json.dumps([*calls, "done"]), encoding="utf-8")
    return path


async def turn_once(client: Client, queue: str, iterations: int) -> tuple[float, int, int, int]:
    handle = await start_turn(
        client,
        TurnInput(agent="bench", messages=["go"], max_iterations=iterations + 1),
        task_queue=queue,
    )
    started = time.perf_counter()
    result = await handle.result()
    elapsed = time.perf_counter() - started
    history = await handle.handle.fetch_history()
    history_bytes = sum(event.ByteSize() for event in history.events)
    conversation = len(json.dumps([m.model_dump(mode="json") for m in result.history]))
    return elapsed, len(history.events), history_bytes, conversation


async def floor_once(client: Client, queue: str, activities: int) -> float:
    started = time.perf_counter()
    await client.execute_workflow(
        Floor.run, activities, id=f"floor-{uuid.uuid4().hex[:8]}", task_queue=queue
    )
    return time.perf_counter() - started


async def main(iterations: list[int], repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedServer(ui=False) as info:
            client = await connect(info.address)
            print(f"embedded server {info.address}\n")
            print("history growth (tool results of 5 KB)")
            print(f"{'K':>5} {'events':>7} {'history KB':>11} {'conversation KB':>16} {'ratio':>6}")
            for k in iterations:
                settings = Settings.model_validate(
                    {
                        "base_dir": tmp,
                        "max_tool_result_bytes": 64 * 1024,
                        "agents": {
                            "bench": {
                                "model": "playback",
                                "playback": str(script(Path(tmp) / f"s{k}.json", k)),
                                "servers": ["local"],
                                "compaction": {"enabled": False},
                            }
                        },
                    }
                )
                queue = f"bench-{k}"
                async with build_worker(
                    client, settings, function_tools={"local": [blob]}, task_queue=queue
                ):
                    _, events, history_bytes, conversation = await turn_once(client, queue, k)
                print(
                    f"{k:>5} {events:>7} {history_bytes / 1024:>11.1f} "
                    f"{conversation / 1024:>16.1f} {history_bytes / conversation:>6.2f}"
                )

            k = 20
            settings = Settings.model_validate(
                {
                    "base_dir": tmp,
                    "agents": {
                        "bench": {
                            "model": "playback",
                            "playback": str(script(Path(tmp) / "overhead.json", k)),
                            "servers": ["local"],
                        }
                    },
                }
            )
            turn_times: list[float] = []
            floor_times: list[float] = []
            async with (
                build_worker(client, settings, function_tools={"local": [blob]}, task_queue="ov"),
                Worker(client, task_queue="floor", workflows=[Floor], activities=[noop]),
            ):
                # Warm both up, then interleave so machine noise hits both alike.
                await turn_once(client, "ov", k)
                await floor_once(client, "floor", 2 * k + 1)
                for _ in range(repeats):
                    turn_times.append((await turn_once(client, "ov", k))[0])
                    floor_times.append(await floor_once(client, "floor", 2 * k + 1))
            turn = statistics.median(turn_times)
            floor = statistics.median(floor_times)
            # A turn of K iterations runs 2K+1 model and tool activities (plus prepare_turn and
            # list_tools); the floor runs 2K+1 no-op activities.
            print(f"\nloop overhead, K={k}, median of {repeats}")
            print(f"  turn:  {turn * 1000 / k:7.1f} ms per iteration ({turn:.2f} s)")
            print(f"  floor: {floor * 1000 / k:7.1f} ms per iteration ({floor:.2f} s)")
            print(f"  ratio: {turn / floor:.2f}x the floor")


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]  # progress as it goes
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", default="5,20,50,100,200")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main([int(k) for k in args.iterations.split(",")], args.repeats))
