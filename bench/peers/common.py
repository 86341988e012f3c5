"""What every peer's workload script shares (standard library only: the scripts run in the
peers' own venvs, where turnkeep is not installed).

A script runs the same turn for each K it is given: the prompt ``bench K=<K>`` to an agent with
one function tool ``blob(i)`` returning 5 KB, its model the fake OpenAI Chat Completions server
at ``--base-url``, which calls the tool K times and then answers (``bench.peers_bench``). A turn
is timed from its start to its result; one untimed turn of ``--warmup`` iterations goes first
(imports, connections, the worker's first workflow). The result is one JSON line on stdout:
``{"seconds": {"20": 1.2, ...}, "errors": {"400": "..."}, "extra": {"20": {...}}}``, where
``extra`` holds what a peer's turn returned as a dict (figures of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

RESULT_BYTES = 5 * 1024
API_KEY = "sk-bench-peers"
BASE_URL_VARIABLE = "BENCH_PEERS_BASE_URL"


def blob_text(i: int) -> str:
    """The tool's 5 KB result, as ``bench.turns.blob`` returns it."""
    return f"result {i}: " + "x" * RESULT_BYTES


def prompt(k: int) -> str:
    return f"bench K={k}"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True, help="the fake server's OpenAI base URL")
    parser.add_argument("--address", default="", help="the Temporal dev server")
    parser.add_argument("--queue", default="bench-peers")
    parser.add_argument("--iterations", default="20", help="K values, comma-separated")
    parser.add_argument("--warmup", type=int, default=2)
    return parser.parse_args()


TurnRunner = Callable[[int], Awaitable[object]]


def main(module: str) -> None:
    """Imports the peer's ``module`` under its own name (so a workflow sandbox can import a
    workflow's module, and with ``BASE_URL_VARIABLE`` set, so the module can build its agent when
    it is imported), opens its ``runner`` (its worker, say), runs the warm-up turn and each K, one
    after the other, and prints the JSON result."""
    args = arguments()
    os.environ[BASE_URL_VARIABLE] = args.base_url
    runner: Callable[[argparse.Namespace], AbstractAsyncContextManager[TurnRunner]]
    runner = importlib.import_module(module).runner

    async def measure() -> None:
        async with runner(args) as run_turn:
            print(json.dumps(await each_k(run_turn)), flush=True)
            # Out at once: a Temporal worker's shutdown can wait a long time on the workflow
            # the server terminated (a turn past the history limit), and the figures are in.
            os._exit(0)

    async def each_k(run_turn: TurnRunner) -> dict[str, dict[str, object]]:
        seconds: dict[str, object] = {}
        errors: dict[str, object] = {}
        extra: dict[str, object] = {}
        await run_turn(args.warmup)
        for k in (int(v) for v in args.iterations.split(",")):
            started = time.perf_counter()
            try:
                result = await run_turn(k)
            except Exception as err:  # reported, not raised: the other K still run
                traceback.print_exc(file=sys.stderr)
                cause = f" ({err.__cause__})" if err.__cause__ else ""
                errors[str(k)] = f"{type(err).__name__}: {err}{cause}"[:300]
                continue
            seconds[str(k)] = time.perf_counter() - started
            if isinstance(result, dict):
                extra[str(k)] = result
        return {"seconds": seconds, "errors": errors, "extra": extra}

    asyncio.run(measure())
