"""A 10 MB tool result with payload storage on: the store holds its text once, however many
payloads carry it (the tool's result, the model's echo of it, the turn's result, which repeats
its messages in its history)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.conftest import make_settings
from turnkeep.client.connection import connect
from turnkeep.client.turns import start_turn
from turnkeep.contract.turn_io import TurnInput
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.worker.build import build_worker

pytestmark = pytest.mark.asyncio

MB = 1024 * 1024
SIZE = 10 * MB


def big_text() -> str:
    """Returns 10 MB of text."""
    return "".join(f"{i:07d}\n" for i in range(SIZE // 8))


async def test_a_10_mb_result_is_stored_once(temporal: ServerInfo, tmp_path: Path) -> None:
    store = tmp_path / "payloads"
    settings = make_settings(
        tmp_path,
        # passthrough answers a tool result with its text: a second copy in another payload.
        agents={"test": {"model": "passthrough", "servers": ["local"]}},
        payload_storage={"path": str(store)},
    )
    client = await connect(temporal.address, temporal.namespace, settings=settings)
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with build_worker(
        client, settings, function_tools={"local": [big_text]}, task_queue=queue
    ):
        prompt = f"***CALL_TOOL local__big_text {json.dumps({})}"
        turn = await start_turn(
            client, TurnInput(agent="test", messages=[prompt]), task_queue=queue
        )
        result = await turn.result()
    assert result.final is not None and result.final.text == big_text()  # whole, both ways
    assert result.history[-1] == result.final and len(result.messages) == 4

    stored = sum(path.stat().st_size for path in store.iterdir())
    # Before: the tool's result, the echo, and the turn's result holding both twice: 7x.
    assert SIZE < stored < 1.5 * SIZE, f"{stored:,} bytes stored for {SIZE:,}"
