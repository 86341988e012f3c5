"""fast-agent 0.10.48 in process on the peers' workload: the floor without durability. One
agent with the function tool ``blob``, its model ``generic.bench`` (fast-agent's OpenAI-compatible
provider, Chat Completions) at the fake server; its history cleared before each turn.

fast-agent makes a new OpenAI client for every model request (``OpenAILLM._openai_client``, used
in an ``async with``), and a new client builds a TLS context (tens of milliseconds on a loaded
2-core machine, even for an ``http://`` URL). So that the floor can be read with and without it,
the time spent making those clients is measured (the method wrapped, nothing else changed) and
returned with each turn as ``client_seconds``.

Run in its own venv (Python ≥ 3.12, as fast-agent 0.10 requires; ``bench.peers_bench`` makes
it): ``python -m bench.peers.fast_agent_peer --base-url ... --iterations 20,100``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from fast_agent import FastAgent
from fast_agent.llm.provider.openai.llm_openai import OpenAILLM

from bench.peers import common


def blob(i: int) -> str:
    """Returns 5 KB of text."""
    return common.blob_text(i)


CLIENT_SECONDS = [0.0]
_make_client = OpenAILLM._openai_client


def _timed_client(self: OpenAILLM) -> object:
    started = time.perf_counter()
    try:
        return _make_client(self)
    finally:
        CLIENT_SECONDS[0] += time.perf_counter() - started


OpenAILLM._openai_client = _timed_client  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def runner(args: argparse.Namespace) -> AsyncIterator[common.TurnRunner]:
    with tempfile.TemporaryDirectory(prefix="bench-fast-agent-") as directory:
        config = Path(directory) / "fastagent.config.yaml"
        settings = {
            "default_model": "generic.bench",
            "generic": {"base_url": args.base_url, "api_key": common.API_KEY},
            "logger": {"level": "error", "progress_display": False, "show_chat": False},
        }
        config.write_text(json.dumps(settings), encoding="utf-8")  # JSON is YAML
        fast = FastAgent(
            "bench-peers",
            config_path=str(config),
            parse_cli_args=False,
            quiet=True,
            isolated=True,
            workspace=directory,
        )

        @fast.agent(name="bench", model="generic.bench", function_tools=[blob])
        async def bench() -> None:
            pass

        async with fast.run() as app:
            agent = app.bench

            async def run_turn(k: int) -> object:
                agent.clear()
                CLIENT_SECONDS[0] = 0.0
                await agent.send(common.prompt(k))
                return {"client_seconds": CLIENT_SECONDS[0]}

            yield run_turn


if __name__ == "__main__":
    common.main("bench.peers.fast_agent_peer")
