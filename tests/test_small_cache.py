"""A worker whose workflow cache is smaller than the workflows it has in flight only replays
more: turns running tool loops, turns waiting for a person and sessions in conversation, three
times as many as the cache holds, all watched by followers, all finish."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from tests.conftest import eventually, make_settings, write_script
from turnkeep.client.sessions import SessionHandle
from turnkeep.client.turns import TurnHandle
from turnkeep.contract.turn_io import TurnResult
from turnkeep.testing import harness

CACHE = 2


async def test_three_times_the_cache_in_flight_all_finish(client: Client, tmp_path: Path) -> None:
    async def look(name: str) -> str:
        """Reads ``name``."""
        await asyncio.sleep(0.05)
        return f"read {name}"

    def write(text: str) -> str:
        """Writes ``text``."""
        return f"wrote {text}"

    reads = {"tool_calls": {"r": {"name": "fs__look", "arguments": {"name": "notes"}}}}
    looper = write_script(tmp_path / "looper.json", *[reads] * 4, "Looked.")
    writes = {"tool_calls": {"w": {"name": "fs__write", "arguments": {"text": "draft"}}}}
    gated = write_script(tmp_path / "gated.json", writes, "Written.")
    settings = make_settings(
        tmp_path,
        agents={
            "looper": {"model": "playback", "playback": str(looper), "servers": ["fs"]},
            "gated": {
                "model": "playback",
                "playback": str(gated),
                "servers": ["fs"],
                "approval": {"tools": ["fs__write"], "timeout": "1h"},
            },
            "chat": {"model": "passthrough"},
        },
    )

    async def follow(turn: TurnHandle) -> list[str]:
        return [m.text async for m in turn.messages()]

    async def converse(session: SessionHandle, n: int) -> list[str]:
        said = []
        for k in range(3):
            sent = await session.send(f"line {n}.{k}")
            start = 2 * (sent.turn - 1)
            said += [m.text async for m in session.messages(start, until_turn=sent.turn)]
        await session.close()
        return said

    async with harness(
        client, settings, function_tools={"fs": [look, write]}, max_cached_workflows=CACHE
    ) as h:
        waiting = [await h.start("write it", agent="gated") for _ in range(CACHE)]
        loops = [await h.start("look", agent="looper") for _ in range(CACHE)]
        sessions = [await h.session(agent="chat") for _ in range(CACHE)]
        followers = [asyncio.create_task(follow(t)) for t in [*waiting, *loops]]
        talks = [asyncio.create_task(converse(s, n)) for n, s in enumerate(sessions)]

        # Clients asking every workflow, cached or not, all along: queries, and decisions for
        # calls that are not waiting (each refused update needs a workflow task to refuse it).
        async def ask_everyone() -> None:
            while True:
                for turn in [*waiting, *loops]:
                    await turn.pending_approvals()
                    # Refused while the turn runs; once it has ended, the server refuses it.
                    with contextlib.suppress(WorkflowUpdateFailedError, RPCError):
                        await turn.decide("no-such-call", True)
                for session in sessions:
                    await session.progress()

        askers = [asyncio.create_task(ask_everyone()) for _ in range(2)]
        for turn in waiting:
            await eventually(turn.pending_approvals, "the write waits for approval")
            await turn.decide("w", True, by="alice")

        async def all_ended() -> tuple[list[list[str]], list[list[str]], list[TurnResult]]:
            return (
                await asyncio.gather(*followers),
                await asyncio.gather(*talks),
                await asyncio.gather(*(t.result() for t in [*waiting, *loops])),
            )

        followed, said, finals = await asyncio.wait_for(all_ended(), timeout=120)
        assert not any(asker.done() for asker in askers)  # they asked all along
        for asker in askers:
            asker.cancel()
    assert followed[:CACHE] == [["", "Written."]] * CACHE
    assert followed[CACHE:] == [["", "", "", "", "Looked."]] * CACHE
    for n, lines in enumerate(said):
        assert lines == [text for k in range(3) for text in [f"line {n}.{k}"] * 2]
    assert [r.final.text for r in finals if r.final] == ["Written."] * CACHE + ["Looked."] * CACHE
