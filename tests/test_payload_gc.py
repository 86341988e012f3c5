"""Garbage collection of the local payload store: old files go, fresh ones and those of running
turns stay, workers sweep on their own, `turnkeep gc` reports what it did, and reading a turn
whose payloads were swept says so instead of failing obscurely."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.converter import StorageDriverRetrieveContext, StorageDriverStoreContext

from tests.conftest import eventually, make_settings, turnkeep, write_script
from tests.test_payload_storage import (
    agent,
    big,
    calls,
    history_bytes,
    payload,
    referenced_digests,
    tool_texts,
)
from tests.test_payload_storage import turnkeep as harness_for
from turnkeep.client.connection import connect
from turnkeep.client.turns import get_turn, start_turn
from turnkeep.config.settings import PayloadStorageSettings
from turnkeep.contract.turn_io import TurnInput
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.payloads import gc as payload_gc
from turnkeep.payloads.gc import collect
from turnkeep.payloads.storage.errors import MissingPayloadError, PayloadExpiredError
from turnkeep.payloads.storage.local import LocalDirectoryDriver
from turnkeep.payloads.storage.sweep import sweep
from turnkeep.worker.build import build_worker

HOUR = 3600.0
CONTEXT = StorageDriverStoreContext()


def age(path: Path, seconds: float) -> Path:
    """Make ``path`` look last stored or read ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def write(path: Path, content: bytes, *, old: bool) -> Path:
    """A file last written just now, or (``old``) two hours ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return age(path, 2 * HOUR) if old else path


def payload_file(directory: Path, content: bytes, *, old: bool) -> Path:
    """A file as the local driver names one (its SHA-256)."""
    return write(directory / hashlib.sha256(content).hexdigest(), content, old=old)


def names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "days"),
    [("7d", 7), ("36h", 1.5), ("90m", 90 / 1440), ("2w", 14), (86400, 1), ("P3D", 3)],
)
def test_retention_takes_durations(given: Any, days: float) -> None:
    retention = PayloadStorageSettings(retention=given).retention
    assert retention == timedelta(days=days)


@pytest.mark.parametrize("given", ["off", "OFF", False, None])
def test_retention_can_be_off(given: Any) -> None:
    assert PayloadStorageSettings(retention=given).retention is None


@pytest.mark.parametrize("given", ["0s", -60, "soon"])
def test_retention_must_be_a_positive_duration(given: Any) -> None:
    with pytest.raises(ValidationError, match="retention"):
        PayloadStorageSettings(retention=given)


def test_default_retention_is_a_week() -> None:
    assert PayloadStorageSettings().retention == timedelta(days=7)


# -- the sweep on its own ---------------------------------------------------------------------


def test_sweep_removes_old_payloads_and_keeps_fresh_used_and_foreign_files(
    tmp_path: Path,
) -> None:
    store = tmp_path / "payloads"
    old = [payload_file(store, b"old %d" % i, old=True) for i in range(2)]
    fresh = payload_file(store, b"fresh", old=False)
    in_use = payload_file(store, b"used by a running turn", old=True)
    # A crashed writer's temporary file, and one being written right now.
    abandoned = write(store / ".0123456789abcdef.k2j4.tmp", b"half", old=True)
    writing = write(store / ".fedcba9876543210.x9z1.tmp", b"in progress", old=False)
    # Payloads a crashed sweep had set aside: an old one goes, a refreshed one is put back.
    aside_old = write(store / f".{'a' * 64}.1f2e3d4c.gc", b"set aside", old=True)
    write(store / f".{'b' * 64}.5a6b7c8d.gc", b"refreshed while set aside", old=False)
    # Not turnkeep's: never touched, however old (payload_storage.path may be shared).
    foreign = write(store / "notes.txt", b"mine", old=True)
    (store / ("c" * 64)).mkdir()  # a directory with a payload's name
    before = names(store)

    dry = sweep(store, timedelta(hours=1), keep={in_use.name}, dry_run=True)
    assert names(store) == before  # a dry run deletes nothing
    assert sorted(dry.removed) == sorted([*old, abandoned, aside_old])

    report = sweep(store, timedelta(hours=1), keep={in_use.name})
    assert sorted(report.removed) == sorted([*old, abandoned, aside_old])
    assert report.removed_bytes == sum(len(b"old %d" % i) for i in range(2)) + 4 + 9
    assert names(store) == {
        fresh.name,
        in_use.name,
        writing.name,
        "b" * 64,  # put back under its payload name
        foreign.name,
        "c" * 64,
    }
    assert (store / ("b" * 64)).read_bytes() == b"refreshed while set aside"
    assert report.in_use == 1 and report.kept == 3  # fresh, in use, put back
    assert report.errors == []


def test_sweep_of_a_directory_not_made_yet_finds_nothing(tmp_path: Path) -> None:
    report = sweep(tmp_path / "never-written", timedelta(hours=1))
    assert report.removed == [] and report.kept == 0 and report.errors == []


async def test_storing_or_reading_a_payload_again_keeps_it(tmp_path: Path) -> None:
    driver = LocalDirectoryDriver(tmp_path / "p")
    stored = payload(b"x" * 1000)
    [claim] = await driver.store(CONTEXT, [stored])
    path = driver.path_for(claim.claim_data["hash_value"])
    retention = timedelta(hours=1)

    # Another turn stores the same bytes: a new reference, so the old file starts over.
    age(path, 2 * HOUR)
    await driver.store(CONTEXT, [stored])
    assert sweep(path.parent, retention).removed == []

    # Reading it (a replay, a client) counts as use too.
    age(path, 2 * HOUR)
    assert await driver.retrieve(StorageDriverRetrieveContext(), [claim]) == [stored]
    assert sweep(path.parent, retention).removed == []

    # Left alone past the retention, it goes.
    age(path, 2 * HOUR)
    assert sweep(path.parent, retention).removed == [path]


async def test_a_swept_payload_is_told_apart_from_a_misplaced_one(tmp_path: Path) -> None:
    driver = LocalDirectoryDriver(tmp_path / "p", retention=timedelta(hours=1))
    [claim] = await driver.store(CONTEXT, [payload(b"y" * 1000)])
    driver.path_for(claim.claim_data["hash_value"]).unlink()
    context = StorageDriverRetrieveContext()

    # Stored just now: not the sweep's doing, so probably the wrong directory.
    with pytest.raises(MissingPayloadError) as missing:
        await driver.retrieve(context, [claim])
    assert not isinstance(missing.value, PayloadExpiredError)
    assert "payload_storage.path" in str(missing.value)

    # Stored two days ago, past the one-hour retention: the sweep removed it.
    two_days_ago = (datetime.now(UTC) - timedelta(days=2)).isoformat(timespec="seconds")
    stale = type(claim)({**claim.claim_data, "stored_at": two_days_ago})
    with pytest.raises(PayloadExpiredError) as expired:
        await driver.retrieve(context, [stale])
    message = str(expired.value)
    assert "stored 2 days ago" in message and "payload_storage.retention (1 hour)" in message
    assert "turnkeep gc" in message


# -- workers sweep ----------------------------------------------------------------------------


async def test_a_worker_sweeps_at_start_and_then_periodically(
    temporal: ServerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(payload_gc, "SWEEP_EVERY", timedelta(seconds=0.2))
    store = tmp_path / "payloads"
    before_start = payload_file(store, b"old before the worker started", old=True)
    fresh = payload_file(store, b"fresh", old=False)
    config = {"payload_storage": {"path": str(store), "retention": "1h"}}
    async with harness_for(temporal, tmp_path, **config):
        await eventually(lambda: not before_start.exists(), "the start-up sweep removed it")
        later = payload_file(store, b"old, found by a later sweep", old=True)
        await eventually(lambda: not later.exists(), "a periodic sweep removed it")
        assert fresh.exists()


async def test_a_worker_warns_when_retention_is_shorter_than_the_namespaces(
    temporal: ServerInfo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=payload_gc.__name__)
    # The dev server keeps closed workflows for a day.
    config = {"payload_storage": {"path": str(tmp_path / "p"), "retention": "12h"}}

    def warned() -> str | None:
        for record in caplog.records:
            if "payload_storage.retention (12 hours)" in record.getMessage():
                return record.getMessage()
        return None

    async with harness_for(temporal, tmp_path, **config):
        message = await eventually(warned, "the worker warned")
    assert f"retention of namespace {temporal.namespace!r} (1 day)" in message


# A tool call that outlasts its worker: it runs (in-process) until the test releases it.
held = asyncio.Event()
released = asyncio.Event()


async def hold() -> str:
    """Wait until the test says."""
    held.set()
    await released.wait()
    return "released"


async def test_a_running_turn_keeps_its_payloads_however_old(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    """A turn outlives both its worker and the retention: the next worker's sweep spares its
    payloads (it will replay from them) and the turn finishes whole."""
    held.clear()
    released.clear()
    store = tmp_path / "payloads"
    script = write_script(
        tmp_path / "s.json",
        calls(("c1", "local__big", {"n_bytes": 400_000})),
        calls(("c2", "local__hold", {})),
        "done",
    )
    agents = agent(script)
    agents["test"]["tool_timeouts"] = {"heartbeat": 2, "max_attempts": 5}
    settings = make_settings(
        tmp_path, agents=agents, payload_storage={"path": str(store), "retention": "1h"}
    )
    client = await connect(temporal.address, temporal.namespace, settings=settings)
    tools = {"local": [big, hold]}
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with build_worker(client, settings, function_tools=tools, task_queue=queue):
        turn = await start_turn(client, TurnInput(agent="test", messages=["go"]), task_queue=queue)
        await asyncio.wait_for(held.wait(), 60)  # the second tool call is running
    # The first worker is gone, with the turn's state in its cache. Every stored file looks
    # unused for two hours, twice the retention; so does one no turn references.
    _, text = await history_bytes(turn)
    used = referenced_digests(text)
    assert used and used <= names(store)
    for name in names(store):
        age(store / name, 2 * HOUR)
    unrelated = payload_file(store, b"nobody's", old=True)

    report = await collect(store, timedelta(hours=1), client, dry_run=True)
    assert unrelated in report.removed and report.in_use == len(used)
    assert not used & {path.name for path in report.removed}
    async with build_worker(client, settings, function_tools=tools, task_queue=queue):
        await eventually(lambda: not unrelated.exists(), "the new worker's sweep ran")
        assert used <= names(store)
        released.set()
        # This worker has never seen the turn: it replays it from history, payloads included.
        result = await asyncio.wait_for(turn.result(), 120)
    assert tool_texts(result) == {"c1": big(400_000), "c2": "released"}
    assert result.final is not None and result.final.text == "done"


# -- reading what was swept, and the CLI ------------------------------------------------------


async def test_a_turn_whose_payloads_were_swept_says_so_when_read(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    store = tmp_path / "payloads"
    script = write_script(
        tmp_path / "s.json", calls(("c1", "local__big", {"n_bytes": 400_000})), "done"
    )
    async with harness_for(
        temporal, tmp_path, agents=agent(script), payload_storage={"path": str(store)}
    ) as h:
        turn = await h.start("go")
        assert (await turn.result()).final is not None
        # The turn has closed: nothing protects its payloads once they are old.
        for name in names(store):
            age(store / name, 2 * HOUR)
        report = await collect(store, timedelta(hours=1), h.client)
    assert report.removed and not any(store.iterdir())

    # A reader whose retention (1 s) the payloads have outlived knows the sweep took them.
    reader = make_settings(tmp_path, payload_storage={"path": str(store), "retention": "1s"})
    client = await connect(temporal.address, temporal.namespace, settings=reader)
    await asyncio.sleep(1.5)  # let the references grow older than that second
    with pytest.raises(PayloadExpiredError, match=r"payload_storage\.retention \(1 second\)"):
        await asyncio.wait_for(get_turn(client, turn.workflow_id).result(), 60)


def test_gc_command_reports_what_it_removed(temporal: ServerInfo, tmp_path: Path) -> None:
    store = tmp_path / "payloads"
    (tmp_path / "turnkeep.yaml").write_text("payload_storage: {path: payloads}\n", "utf-8")
    old = [payload_file(store, b"%d" % i * 1000, old=True) for i in range(2)]
    fresh = payload_file(store, b"fresh", old=False)

    dry = turnkeep("gc", "--older-than", "1h", "--dry-run", temporal=temporal, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "would remove 2 file(s) (2,000 bytes) unused for 1 hour; kept 1 (5 bytes)" in dry.stdout
    assert all(path.exists() for path in old)

    # The configured retention (a week) spares them all.
    kept = turnkeep("gc", temporal=temporal, cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    assert "removed 0 file(s) (0 bytes) unused for 7 days; kept 3" in kept.stdout

    done = turnkeep("gc", "--older-than", "1h", "--list", temporal=temporal, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "removed 2 file(s) (2,000 bytes) unused for 1 hour; kept 1 (5 bytes)" in done.stdout
    assert f"in {store}" in done.stdout
    assert all(str(path) in done.stdout for path in old)
    assert names(store) == {fresh.name}

    bad = turnkeep("gc", "--older-than", "soon", temporal=temporal, cwd=tmp_path)
    assert bad.returncode == 2 and "'soon' is not a duration" in bad.stderr


def test_gc_command_leaves_s3_to_a_lifecycle_rule(temporal: ServerInfo, tmp_path: Path) -> None:
    (tmp_path / "turnkeep.yaml").write_text(
        "payload_storage: {driver: s3, bucket: turns}\n", "utf-8"
    )
    result = turnkeep("gc", temporal=temporal, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "never deletes S3 objects" in result.stdout and "lifecycle rule" in result.stdout
