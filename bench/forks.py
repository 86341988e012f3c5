"""The fork of a long session (issue #47): a session of ``turns`` exchanges (the ``playback``
model answering at once, as in the ``sessions`` section's *short* kind), then forked at its
last message and at one in the middle of a turn (``SessionHandle.fork``, by a client that has
read none of its segments before), each fork then answering one message.

For each fork: the time ``fork`` takes (the client reads the source's last conversation
reference from its history, walks its stored segments, stores the one segment the fork does
not share, and starts the fork's workflow), the bytes payload storage gained, the fork's
start in its history, and its first turn. Against, in the same run: opening an empty session
(the same workflow start without a conversation), and the source's conversation itself, which
a fork that copied it would store again.

Target: the fork of a 1,000-turn session takes ≤ 1 s and stores ≤ 10 KB of new data.
"""

from __future__ import annotations

import time
import uuid

from bench.environment import Environment
from bench.report import Table, Target, progress
from bench.session_storage import AGENT, TOOLS, _config, _stored
from turnkeep.client.connection import connect
from turnkeep.client.sessions import SessionHandle, open_session
from turnkeep.config.settings import Settings
from turnkeep.worker.build import build_worker

TIME_MAX = 1.0
STORED_MAX = 10 * 1024
TARGET = f"fork of a 1,000-turn session ≤ {TIME_MAX:g} s and ≤ {STORED_MAX // 1024} KB stored"


async def _answered(session: SessionHandle, start: int, turn: int) -> int:
    index = start
    async for _ in session.messages(start, until_turn=turn):
        index += 1
    return index


async def fork_bench(env: Environment, turns: int) -> tuple[Table, list[Target]]:
    directory = env.tmp / "forks"
    directory.mkdir(exist_ok=True)
    settings = Settings.model_validate(_config(directory, env.payloads, "short"))
    queue = f"bench-fork-{uuid.uuid4().hex[:6]}"
    table = Table(
        f"Fork of a {turns:,}-turn session",
        ["fork at", "fork", "stored", "start event", "first turn", "empty session's start"],
    )
    met = True
    async with build_worker(env.client, settings, function_tools=TOOLS, task_queue=queue):
        source = await open_session(env.client, agent=AGENT, task_queue=queue)
        index = 0
        conversation = 0
        for n in range(1, turns + 1):
            sent = await source.send(f"message {n}")
            async for message in source.messages(index, until_turn=sent.turn):
                index += 1
                conversation += len(message.model_dump_json())
            if n % 100 == 0:
                progress(f"fork: {n} of {turns} turns")
        for at in (index, index // 2 + 1):
            # A client that has read none of the source's segments (a cold codec cache).
            client = await connect(env.info.address, env.info.namespace, settings=settings)
            started = time.perf_counter()
            empty = await open_session(client, agent=AGENT, task_queue=queue)
            empty_took = time.perf_counter() - started
            await empty.handle.terminate()
            before = _stored(env.payloads)
            started = time.perf_counter()
            forked = await SessionHandle(source.handle, client).fork(at, task_queue=queue)
            took = time.perf_counter() - started
            stored = _stored(env.payloads) - before
            history = await forked.handle.fetch_history()
            start_bytes = history.events[0].ByteSize()
            started = time.perf_counter()
            sent = await forked.send("go on")
            await _answered(forked, (await forked.progress()).count, sent.turn)
            first_turn = time.perf_counter() - started
            await forked.handle.terminate()
            met = met and took <= TIME_MAX and stored <= STORED_MAX
            table.add(
                f"{at:,} of {index:,}",
                f"{took * 1000:.0f} ms",
                f"{stored:,} B",
                f"{start_bytes:,} B",
                f"{first_turn * 1000:.0f} ms",
                f"{empty_took * 1000:.0f} ms",
            )
        await source.handle.terminate()
    table.notes.append(
        f"The source's conversation: {conversation:,} bytes of messages' JSON, which a fork that "
        "copied it would store again. Stored: what payload storage gained during the fork (its "
        "one segment, and the note that keeps its source's segments from the sweep)."
    )
    return table, [Target(TARGET, table.rows[0][1] + ", " + table.rows[0][2], met)]
