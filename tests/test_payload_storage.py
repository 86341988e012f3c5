"""Large payloads on a real Temporal dev server: external payload storage keeps them out of the
workflow history (and under Temporal's 2 MB payload limit), and without it a turn whose result
is too large fails with an error that says what to do instead of retrying for ever."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.converter import StorageDriverRetrieveContext, StorageDriverStoreContext
from temporalio.exceptions import ApplicationError

from tests.conftest import Harness, history_text, make_settings, write_script
from turnkeep.activities.tools import INLINE_TOOL_RESULT_BYTES, tool_result_limit
from turnkeep.client.connection import connect
from turnkeep.client.sessions import open_session
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.turn_io import TurnResult
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.payloads.limits import RESULT_TOO_LARGE
from turnkeep.payloads.storage import external_storage
from turnkeep.payloads.storage.errors import (
    MissingPayloadError,
    PayloadStorageConfigError,
    PayloadStorageError,
)
from turnkeep.payloads.storage.local import PIECE_BYTES, LocalDirectoryDriver, split_pieces
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.worker.build import build_worker
from turnkeep.worker.plugin import PAYLOAD_LIMIT_BYTES, FunctionTools, TurnkeepPlugin

MB = 1_000_000
PATTERN = "0123456789abcdef"


def big(n_bytes: int) -> str:
    """Return n_bytes of text."""
    return (PATTERN * (n_bytes // len(PATTERN) + 1))[:n_bytes]


def blob(i: int, kb: int = 5) -> str:
    """Return ``kb`` KB of text."""
    return f"result {i}: " + "x" * kb * 1024


TOOLS: FunctionTools = {"local": [big, blob]}


def agent(script: Path) -> dict[str, Any]:
    return {
        "test": {
            "model": "playback",
            "playback": str(script),
            "servers": ["local"],
            "compaction": {"enabled": False},
        }
    }


def calls(*specs: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": {cid: {"name": name, "arguments": args} for cid, name, args in specs}}


# A turn whose tool results pile up past 2 MB in its TurnResult (which holds the turn's messages
# and the whole conversation): as 200 iterations of 5 KB results would, in an eighth of the time.
ITERATIONS, RESULT_KB = 25, 48


def long_turn(tmp_path: Path) -> Path:
    """A script of tool calls whose results add up to a TurnResult over 2 MB."""
    steps = [calls((f"c{i}", "local__blob", {"i": i, "kb": RESULT_KB})) for i in range(ITERATIONS)]
    return write_script(tmp_path / "long.json", *steps, "done")


@asynccontextmanager
async def turnkeep(temporal: ServerInfo, tmp_path: Path, **config: Any) -> AsyncIterator[Harness]:
    """A client and a worker that share the payload storage the settings describe (the
    session's `client` fixture has the default storage)."""
    settings = make_settings(tmp_path, **config)
    client = await connect(temporal.address, temporal.namespace, settings=settings)
    task_queue = f"test-{uuid.uuid4().hex[:10]}"
    async with build_worker(client, settings, function_tools=TOOLS, task_queue=task_queue):
        yield Harness(client, settings, task_queue)


def tool_texts(result: TurnResult) -> dict[str, str]:
    return {
        cid: res.text
        for message in result.messages
        for cid, res in (message.tool_results or {}).items()
    }


async def history_bytes(turn: TurnHandle) -> tuple[int, str]:
    history = await turn.handle.fetch_history()
    return sum(event.ByteSize() for event in history.events), history_text(history)


def anthropic_agent(fake: FakeModelApi) -> dict[str, Any]:
    """An agent on the Anthropic SDK, talking to the fake API (which records each request)."""
    return {
        "anthropic": {"api_key": "k", "base_url": fake.base_url_anthropic},
        "agents": {
            "test": {
                "model": "anthropic.test-model",
                "servers": ["local"],
                # A 5 MB result is far past any context window: nothing to summarise here.
                "compaction": {"enabled": False},
            }
        },
    }


def tool_result_texts(body: Any) -> list[str]:
    """The text of every tool_result block in an Anthropic Messages request body."""
    return [
        part["text"]
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
        for part in block["content"]
        if part["type"] == "text"
    ]


def referenced_digests(text: str) -> set[str]:
    """The stored files the external-storage references in a decoded history name: each
    claim's SHA-256, or its pieces' when it was stored in pieces."""
    found: set[str] = set()
    for claim in re.findall(r'\{[^{}]*"hash_value"[^{}]*\}', text):
        pieces = re.search(r'"pieces":\s*"([0-9a-f,]+)"', claim)
        found.update(
            pieces[1].split(",")
            if pieces
            else re.findall(r'"hash_value":\s*"([0-9a-f]{64})"', claim)
        )
    return found


# -- storage on --------------------------------------------------------------------------------


async def test_5_mb_tool_result_is_stored_outside_the_history(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    store = tmp_path / "payloads"
    script = write_script(
        tmp_path / "s.json", calls(("c1", "local__big", {"n_bytes": 5 * MB})), "done"
    )
    # Default settings but the directory: with storage on, no result is cut.
    async with turnkeep(
        temporal, tmp_path, agents=agent(script), payload_storage={"path": str(store)}
    ) as h:
        turn = await h.start("go")
        result = await turn.result()
    assert tool_texts(result) == {"c1": big(5 * MB)}  # intact, all 5 MB of it
    assert result.final is not None and result.final.text == "done"

    size, text = await history_bytes(turn)
    # The point of the feature: the history holds references, not the 5 MB (twice over).
    assert size < 2 * MB
    assert PATTERN * 64 not in text
    digests = referenced_digests(text)
    assert digests, "no external-storage reference in the history"
    assert re.search(r'"driverName":\s*"turnkeep.local"', text)
    files = {p.name: p.stat().st_size for p in store.iterdir()}
    assert digests <= set(files)  # every reference has its file
    assert max(files.values()) >= 5 * MB  # the result's text, in a file of its own
    assert not [name for name in files if name.endswith(".tmp")]


async def test_5_mb_tool_result_reaches_the_model_whole(
    temporal: ServerInfo, tmp_path: Path, fake: FakeModelApi
) -> None:
    fake.script(
        Reply.tool_calls(("c1", "local__big", {"n_bytes": 5 * MB})),
        Reply.text("read it all"),
        api="anthropic",
    )
    async with turnkeep(
        temporal,
        tmp_path,
        **anthropic_agent(fake),
        payload_storage={"path": str(tmp_path / "payloads")},
    ) as h:
        result = await h.run("go")
    assert result.final is not None and result.final.text == "read it all"
    first, second = fake.requests_for("anthropic")
    assert tool_result_texts(first.body) == []
    # What the model was sent: the tool's 5 MB, byte for byte, and no truncation note.
    [sent] = tool_result_texts(second.body)
    assert len(sent) == 5 * MB and sent == big(5 * MB)
    assert "truncated" not in json.dumps(second.body["messages"])


async def test_long_turn_with_a_result_over_2_mb_completes(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    async with turnkeep(
        temporal,
        tmp_path,
        agents=agent(long_turn(tmp_path)),
        payload_storage={"path": str(tmp_path / "payloads")},
    ) as h:
        turn = await h.start("go", max_iterations=ITERATIONS + 1)
        result = await turn.result()
    assert result.iterations == ITERATIONS
    assert len(tool_texts(result)) == ITERATIONS
    # This is a TurnResult that Temporal refuses inline.
    assert len(result.model_dump_json().encode()) > PAYLOAD_LIMIT_BYTES
    _, text = await history_bytes(turn)
    assert referenced_digests(text)


# -- storage off -------------------------------------------------------------------------------


async def test_without_storage_a_result_over_the_limit_fails_the_turn_clearly(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    async with turnkeep(
        temporal,
        tmp_path,
        agents=agent(long_turn(tmp_path)),
        payload_storage={"driver": "off"},
    ) as h:
        turn = await h.start("go", max_iterations=ITERATIONS + 1)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(turn.result(), 60)
        # Not left running (or retrying its last workflow task): the run has closed.
        status = (await turn.handle.describe()).status
    assert status == WorkflowExecutionStatus.FAILED
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == RESULT_TOO_LARGE and cause.non_retryable
    assert "2 MB payload limit" in cause.message and "payload_storage" in cause.message
    size, text = await history_bytes(turn)
    assert size < 2 * MB and not referenced_digests(text)


async def test_without_storage_a_session_hands_its_turns_the_conversation(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    """No codec expands a session's first turn's empty reference, nor stores the segment of
    its messages: the turn takes them as they are, and the session goes on handing each turn
    the conversation itself."""
    config = {"agents": {"test": {"model": "passthrough"}}, "payload_storage": {"driver": "off"}}
    async with turnkeep(temporal, tmp_path, **config) as h:
        session = await open_session(h.client, agent="test", task_queue=h.task_queue)
        seen = []
        for line in ("one", "two"):
            sent = await session.send(line)
            seen += [m.text async for m in session.messages(len(seen), until_turn=sent.turn)]
        assert seen == ["one", "one", "two", "two"]
        turn = await get_turn(h.client, f"{session.session_id}/turn-2").result()
        assert turn.conversation is None
        assert [m.text for m in turn.history] == seen
        await session.close()


async def test_without_storage_a_large_tool_result_is_truncated_with_a_note(
    temporal: ServerInfo, tmp_path: Path, fake: FakeModelApi
) -> None:
    fake.script(
        Reply.tool_calls(("c1", "local__big", {"n_bytes": 5 * MB})),
        Reply.text("saw the start"),
        api="anthropic",
    )
    async with turnkeep(
        temporal, tmp_path, **anthropic_agent(fake), payload_storage={"driver": "off"}
    ) as h:
        turn = await h.start("go")
        result = await turn.result()
    assert result.final is not None and result.final.text == "saw the start"
    # The model got the start of the result and, last, a note saying how much it did not get.
    [kept, note] = tool_result_texts(fake.requests_for("anthropic")[1].body)
    assert big(5 * MB).startswith(kept) and len(kept) > INLINE_TOOL_RESULT_BYTES - 1024
    assert re.fullmatch(
        rf"\[turnkeep: tool result truncated from 5,000,\d{{3}} to "
        rf"{INLINE_TOOL_RESULT_BYTES:,} bytes\]",
        note,
    ), note
    [stored] = (m.tool_results["c1"] for m in result.messages if m.tool_results)
    assert [block.text for block in stored.content] == [kept, note]
    size, text = await history_bytes(turn)
    assert size < 2 * MB and not referenced_digests(text)


@pytest.mark.parametrize(
    ("cap", "storage_on", "limit"),
    [
        (None, True, None),  # stored whole
        (None, False, INLINE_TOOL_RESULT_BYTES),
        (1000, True, 1000),  # asked for: cut even though it could be stored
        (1000, False, 1000),
    ],
)
def test_tool_results_are_cut_only_without_storage_or_when_asked(
    tmp_path: Path, cap: int | None, storage_on: bool, limit: int | None
) -> None:
    settings = make_settings(tmp_path, max_tool_result_bytes=cap)
    assert tool_result_limit(settings.max_tool_result_bytes, storage_on=storage_on) == limit


def test_without_storage_tool_results_must_stay_under_the_limit(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, max_tool_result_bytes=5 * MB, payload_storage={"driver": "off"}
    )
    with pytest.raises(ValueError, match=r"max_tool_result_bytes .* payload_storage is off"):
        TurnkeepPlugin(settings)


# -- reading back ------------------------------------------------------------------------------


async def test_a_missing_payload_file_is_named_in_the_error(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    store = tmp_path / "payloads"
    script = write_script(
        tmp_path / "s.json", calls(("c1", "local__big", {"n_bytes": 400_000})), "done"
    )
    config: dict[str, Any] = {"agents": agent(script), "payload_storage": {"path": str(store)}}
    async with turnkeep(temporal, tmp_path, **config) as h:
        turn = await h.start("go")
        await turn.result()
    removed = sorted(store.iterdir())
    assert removed
    for path in removed:
        path.unlink()

    client = await connect(
        temporal.address, temporal.namespace, settings=make_settings(tmp_path, **config)
    )
    with pytest.raises(MissingPayloadError) as missing:
        await get_turn(client, turn.workflow_id).result()
    message = str(missing.value)
    assert str(store) in message and "payload_storage.path" in message
    assert any(str(path) in message for path in removed)


async def test_a_worker_refuses_a_client_with_other_storage(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, payload_storage={"path": str(tmp_path / "worker")})
    other = make_settings(tmp_path, payload_storage={"path": str(tmp_path / "client")})
    client = await connect(temporal.address, temporal.namespace, settings=other)
    with pytest.raises(ValueError, match="disagree on payload storage") as err:
        build_worker(client, settings, task_queue="unused")
    assert str(tmp_path / "worker") in str(err.value) and str(tmp_path / "client") in str(err.value)
    # Same settings, same storage: accepted.
    same = await connect(temporal.address, temporal.namespace, settings=settings)
    build_worker(same, settings, task_queue="unused")


# -- the local driver on its own ---------------------------------------------------------------


def payload(data: bytes) -> Payload:
    return Payload(metadata={"encoding": b"binary/plain"}, data=data)


async def test_local_driver_is_content_addressed_and_safe_for_concurrent_writers(
    tmp_path: Path,
) -> None:
    driver = LocalDirectoryDriver(tmp_path / "p")
    same = payload(b"x" * 300_000)
    # Retries and concurrent workers storing the same payload: one file, same claim.
    claims = await asyncio.gather(
        *(driver.store(StorageDriverStoreContext(), [same]) for _ in range(8))
    )
    assert len({c[0].claim_data["hash_value"] for c in claims}) == 1
    assert [p.name for p in (tmp_path / "p").iterdir()] == [claims[0][0].claim_data["hash_value"]]
    [back] = await driver.retrieve(StorageDriverRetrieveContext(), claims[0])
    assert back == same

    # A damaged file is reported, never decoded; a claim cannot name a path of its own.
    path = driver.path_for(claims[0][0].claim_data["hash_value"])
    path.write_bytes(b"not what was stored")
    with pytest.raises(PayloadStorageError, match="damaged"):
        await driver.retrieve(StorageDriverRetrieveContext(), claims[0])
    crafted = type(claims[0][0])({"hash_algorithm": "sha256", "hash_value": "../../etc/passwd"})
    with pytest.raises(PayloadStorageError, match="not a SHA-256"):
        await driver.retrieve(StorageDriverRetrieveContext(), [crafted])


def _pieces_by_walking(data: bytes) -> list[bytes]:
    """``split_pieces`` as its docstring says it, one quote-free run at a time."""
    pieces: list[bytes] = []
    done = offset = 0
    for run in data.split(b'"'):
        if len(run) >= PIECE_BYTES:
            pieces += [data[done:offset]] if offset > done else []
            pieces.append(run)
            done = offset + len(run)
        offset += len(run) + 1
    return [*pieces, data[done:]] if done < len(data) or not pieces else pieces


@pytest.mark.parametrize(
    "runs",
    [
        [],
        [10],
        [PIECE_BYTES - 1],
        [PIECE_BYTES],
        [3, PIECE_BYTES + 7, 2],
        [PIECE_BYTES // 2 - 1, PIECE_BYTES - 1, PIECE_BYTES // 2 + 1],
        [PIECE_BYTES // 2 + 3, PIECE_BYTES, 0, 2 * PIECE_BYTES + 1],
        [5] * 30_000,  # a conversation's JSON: many short strings
    ],
)
def test_payloads_are_cut_around_long_runs_without_quotes(runs: list[int]) -> None:
    data = b'"'.join(b"x" * n for n in runs)
    pieces = split_pieces(data)
    assert b"".join(pieces) == data
    assert pieces == _pieces_by_walking(data)
    assert sum(len(p) >= PIECE_BYTES and b'"' not in p for p in pieces) == sum(
        n >= PIECE_BYTES for n in runs
    )


def test_default_directory_follows_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNKEEP_STATE_DIR", str(tmp_path / "state"))
    storage = external_storage(make_settings(tmp_path).payload_storage)
    assert storage is not None and storage.payload_size_threshold == 256 * 1024
    [driver] = storage.drivers
    assert isinstance(driver, LocalDirectoryDriver)
    assert driver.directory == tmp_path / "state" / "payloads"
    # A relative path is relative to the config file's directory.
    settings = make_settings(tmp_path, payload_storage={"path": "blobs"})
    relative = external_storage(settings.payload_storage, settings.base_dir)
    assert relative is not None
    [driver] = relative.drivers
    assert isinstance(driver, LocalDirectoryDriver) and driver.directory == tmp_path / "blobs"
    off = make_settings(tmp_path, payload_storage={"driver": "off"})
    assert external_storage(off.payload_storage, off.base_dir) is None


@pytest.mark.skipif(importlib.util.find_spec("aioboto3") is not None, reason="aioboto3 installed")
def test_s3_without_aioboto3_says_what_to_install(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, payload_storage={"driver": "s3", "bucket": "b"})
    with pytest.raises(PayloadStorageConfigError, match=r'pip install "turnkeep\[s3\]"'):
        external_storage(settings.payload_storage)
