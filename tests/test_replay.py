"""Determinism guard: turn histories replay against the current workflow code.

Histories under ``tests/histories/`` were recorded from representative turns by an earlier
version of the code; replaying them here makes a non-deterministic change to ``workflows/``
fail CI. After an intended, versioned change (see README, "Changing the workflow safely"),
refresh them with ``TURNKEEP_RECORD_HISTORIES=1 pytest tests/test_replay.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from tests.conftest import HarnessFactory, write_script
from worker.plugin import replay_plugin

pytestmark = pytest.mark.asyncio

HISTORIES = Path(__file__).with_name("histories")
RECORD = os.environ.get("TURNKEEP_RECORD_HISTORIES") == "1"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def replayer() -> Replayer:
    return Replayer(workflows=[], plugins=[replay_plugin()])


def scripted(*specs: tuple[str, int, int]) -> dict[str, Any]:
    calls = {cid: {"name": "local__add", "arguments": {"a": a, "b": b}} for cid, a, b in specs}
    return {"tool_calls": calls}


SCENARIOS: dict[str, tuple[list[Any], dict[str, Any]]] = {
    "plain": (["Just text."], {}),
    "parallel_tools": (
        [scripted(("c1", 1, 2), ("c2", 3, 4)), scripted(("c3", 5, 6)), "Sums: 3, 7, 11."],
        {},
    ),
    "max_iterations": ([scripted((f"c{i}", i, i)) for i in range(5)], {"max_iterations": 1}),
    "structured_output": (
        [scripted(("c1", 2, 2)), "It is four.", '{"answer": 4}'],
        {"structured_output": {"type": "object"}},
    ),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_scenario_replays_fresh_and_recorded(
    name: str, harness: HarnessFactory, tmp_path: Path
) -> None:
    script, overrides = SCENARIOS[name]
    path = write_script(tmp_path / "script.json", *script)
    config = {
        "agents": {"test": {"model": "playback", "playback": str(path), "servers": ["local"]}}
    }
    async with harness({"local": [add]}, **config) as h:
        handle = await h.start("go", **overrides)
        await handle.result()
        fresh = await handle.handle.fetch_history()
    await replayer().replay_workflow(fresh)

    recorded = HISTORIES / f"{name}.json"
    if RECORD:
        HISTORIES.mkdir(exist_ok=True)
        recorded.write_text(fresh.to_json(), encoding="utf-8")
    assert recorded.exists(), (
        f"no recorded history for {name}; record with TURNKEEP_RECORD_HISTORIES=1"
    )
    old = WorkflowHistory.from_json(f"recorded-{name}", recorded.read_text(encoding="utf-8"))
    await replayer().replay_workflow(old)
