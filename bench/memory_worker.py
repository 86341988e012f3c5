"""A worker in a process of its own, for the memory benchmark (``bench.memory``) to read
the resident memory of::

    python -m bench.memory_worker turn  --address A --queue Q --slots N --status F --config C
    python -m bench.memory_worker floor --address A --queue Q --slots N --status F

``turn`` is a turnkeep worker built from the turnkeep.yaml ``--config`` as ``turnkeep worker``
builds one; ``floor`` a bare Temporal worker for ``Floor``. Both may run ``--slots`` activities
and cache as many workflows, so every workflow the benchmark starts is really in flight. Once
polling, and then every 0.2 s, the process writes to ``--status`` how many ``wait`` activities
have started; it runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from bench import floor
from bench.environment import floor_worker
from turnkeep.client.connection import connect
from turnkeep.config.files import load_settings
from turnkeep.worker.build import build_worker


def _worker(kind: str, client: Client, args: argparse.Namespace) -> Worker:
    options = {"max_concurrent_activities": args.slots, "max_cached_workflows": args.slots}
    if kind == "turn":
        settings = load_settings(Path(args.config))
        return build_worker(client, settings, task_queue=args.queue, **options)
    return floor_worker(client, args.queue, **options)


async def main(args: argparse.Namespace) -> None:
    if args.kind == "turn":
        client = await connect(
            args.address, args.namespace, settings=load_settings(Path(args.config))
        )
    else:
        client = await Client.connect(args.address, namespace=args.namespace)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    status = Path(args.status)
    async with _worker(args.kind, client, args):
        while not stop.is_set():
            status.with_suffix(".tmp").write_text(json.dumps({"waiting": floor.waiting}))
            status.with_suffix(".tmp").replace(status)  # never read half-written
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["turn", "floor"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--config")
    asyncio.run(main(parser.parse_args()))
