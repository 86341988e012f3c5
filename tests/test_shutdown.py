"""Graceful shutdown of ``turnkeep worker`` processes (``turnkeep.worker.shutdown``), with
real signals.

A turn's tool call (``tests.gated_tool``) holds until the test releases it, so the signal
certainly lands mid-call. On SIGTERM the worker's readiness probe turns 503 at once, the worker
stops polling but stays up while the call runs, and exits 0 once it has finished; the turn
then completes on the other worker with nothing run twice. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.conftest import eventually, write_script
from tests.test_health import probe
from tests.worker_process import REPO, WorkerProcesses, write_config
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.config.files import ConfigError
from turnkeep.config.settings import WorkerSettings
from turnkeep.contract.turn_io import TurnInput
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.worker.shutdown import worker_settings

pytestmark = pytest.mark.slow

WITHIN = 120.0  # generous bounds for a loaded 2-core machine; not timing claims


def gated_config(tmp_path: Path, task_queue: str, record: Path, release: Path) -> Path:
    """One tool call that holds until ``release`` exists, then the answer."""
    call = {
        "name": "gate__hold",
        "arguments": {"tag": "slow", "record": str(record), "release": str(release)},
    }
    script = write_script(tmp_path / "script.json", {"tool_calls": {"c1": call}}, "all done")
    return write_config(
        tmp_path / "turnkeep.yaml",
        {
            "task_queue": task_queue,
            "function_tools": {"gate": ["tests.gated_tool:hold"]},
            "agents": {"test": {"servers": ["gate"], "model": "playback", "playback": str(script)}},
            # Far beyond what the test needs: the worker must wait for the call, not give up.
            "worker": {"graceful_shutdown": "5m"},
        },
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def record_lines(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


async def start_gated_turn(client: Client, task_queue: str) -> TurnHandle:
    turn = TurnInput.model_validate({"agent": "test", "messages": ["go"]})
    return await start_turn(client, turn, task_queue=task_queue)


async def test_sigterm_mid_tool_call_drains_and_the_turn_completes_on_another_worker(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    task_queue = f"test-shutdown-{uuid.uuid4().hex[:10]}"
    record, release = tmp_path / "record.jsonl", tmp_path / "release"
    config = gated_config(tmp_path, task_queue, record, release)
    port = free_port()
    readyz, healthz = f"http://127.0.0.1:{port}/readyz", f"http://127.0.0.1:{port}/healthz"
    with WorkerProcesses(config, temporal.address, tmp_path / "logs", temporal.namespace) as fleet:
        first = fleet.start("--health", f"127.0.0.1:{port}")
        await fleet.wait_polling(client, task_queue, first, within=WITHIN)
        assert (await eventually(lambda: _probe_ok(readyz), "ready", within=WITHIN)) == 200

        # Only the first worker polls, so the call runs there.
        handle = await start_gated_turn(client, task_queue)
        await eventually(lambda: record_lines(record), "the tool call started", within=WITHIN)
        second = fleet.start()
        await fleet.wait_polling(client, task_queue, second, within=WITHIN)

        process = fleet.running[first]
        process.send_signal(signal.SIGTERM)
        # Not ready from the signal on, though alive and still running the call.
        _, body = await eventually(
            lambda: _probe_unready(readyz), "readiness turned 503", within=WITHIN
        )
        assert body == {"status": "not ready", "reason": "shutting down"}
        assert await probe(healthz) == (200, {"status": "ok"})
        # It has stopped polling, and waits for the call.
        first_log = tmp_path / "logs" / "worker-0.log"
        await eventually(
            lambda: "stopped polling" in first_log.read_text(), "it stopped polling", WITHIN
        )
        assert process.poll() is None, fleet.log_tail()
        assert [e["event"] for e in record_lines(record)] == ["start"]

        release.touch()
        code = await asyncio.to_thread(process.wait, WITHIN)
        fleet.running.pop(first)
        assert code == 0, fleet.log_tail()
        result = await asyncio.wait_for(handle.result(), WITHIN)

    assert result.final is not None and result.final.text == "all done"
    # The call ran once, to its end, in the worker that was told to stop.
    lines = record_lines(record)
    assert [(e["event"], e["pid"]) for e in lines] == [("start", first), ("done", first)]
    # Each activity completed once, at its first attempt; the turn went on on the other worker.
    events = [
        e async for e in client.get_workflow_handle(handle.workflow_id).fetch_history_events()
    ]
    scheduled: dict[int, str] = {}
    completed: Counter[str] = Counter()
    ran_on: dict[int, str] = {}
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            assert started.attempt == 1, scheduled[started.scheduled_event_id]
            ran_on[started.scheduled_event_id] = started.identity
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            completed[scheduled[done.scheduled_event_id]] += 1
        assert event.event_type not in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
            EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
        )
    assert completed["call_tool"] == 1
    assert completed["llm_step"] == 2
    assert sorted(completed.elements()) == sorted(scheduled.values())
    last_model_call = max(i for i, kind in scheduled.items() if kind == "llm_step")
    assert ran_on[last_model_call].startswith(f"{second}@")

    log = first_log.read_text()
    for phase in ("SIGTERM: not ready", "stopped polling", "worker stopped"):
        assert log.count(phase) == 1, log
    # One line per event: not the SDK's shutdown line once per task queue, and the turn's
    # identity as key=value, not a Python dict.
    assert "Beginning worker shutdown" not in log and "{'" not in log, log


async def test_a_second_signal_exits_at_once(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    """SIGINT starts the shutdown like SIGTERM; a second signal does not wait for the call."""
    task_queue = f"test-shutdown-{uuid.uuid4().hex[:10]}"
    record, release = tmp_path / "record.jsonl", tmp_path / "release"
    config = gated_config(tmp_path, task_queue, record, release)
    with WorkerProcesses(config, temporal.address, tmp_path / "logs", temporal.namespace) as fleet:
        pid = await fleet.start_polling(client, task_queue)
        handle = await start_gated_turn(client, task_queue)
        try:
            await eventually(lambda: record_lines(record), "the tool call started", within=WITHIN)
            process = fleet.running[pid]
            process.send_signal(signal.SIGINT)
            await eventually(
                lambda: "SIGINT: not ready" in fleet.log_tail(), "the shutdown began", WITHIN
            )
            assert process.poll() is None
            process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(process.wait, WITHIN)
            fleet.running.pop(pid)
            assert code == 128 + signal.SIGTERM
            assert "second signal (SIGTERM): exiting now" in fleet.log_tail()
            # The call never finished: the worker did not wait for it.
            assert [e["event"] for e in record_lines(record)] == ["start"]
        finally:
            await handle.handle.terminate("test over")


async def test_a_signal_while_connecting_exits_cleanly(tmp_path: Path) -> None:
    """Before the worker polls there is nothing to drain: it stops at once, with status 0."""
    with socket.socket() as frontend:  # accepts connections and never answers
        frontend.bind(("127.0.0.1", 0))
        frontend.listen()
        config = write_config(tmp_path / "turnkeep.yaml", {"task_queue": "never-polled"})
        port = free_port()
        argv = [sys.executable, "-m", "turnkeep.cli", "worker", "--config", str(config)]
        argv += ["--address", f"127.0.0.1:{frontend.getsockname()[1]}"]
        argv += ["--health", f"127.0.0.1:{port}"]
        log = tmp_path / "worker.log"
        with log.open("wb") as out:
            process = subprocess.Popen(  # noqa: ASYNC220 - waited on in a thread below
                argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            _, body = await eventually(
                lambda: _probe_unready(f"http://127.0.0.1:{port}/readyz"),
                "the endpoint answered",
                WITHIN,
            )
            assert body == {"status": "not ready", "reason": "connecting to Temporal"}
            process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(process.wait, WITHIN)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert code == 0, log.read_text()
    assert "SIGTERM before the worker polled: stopping" in log.read_text()


def test_flags_override_the_worker_section() -> None:
    configured = WorkerSettings.model_validate({"graceful_shutdown": "2m", "health": ":8080"})
    merged = worker_settings(configured, graceful_shutdown="45s", health=None)
    assert (merged.graceful_shutdown, merged.health) == (timedelta(seconds=45), ":8080")
    assert worker_settings(WorkerSettings(), graceful_shutdown=None, health=None) == (
        WorkerSettings(graceful_shutdown=timedelta(seconds=30), health=None)
    )
    for flags in ({"graceful_shutdown": "soon"}, {"health": "8080"}):
        with pytest.raises(ConfigError, match="worker options"):
            worker_settings(configured, **{"graceful_shutdown": None, "health": None, **flags})


def _probe_ok(url: str) -> Any:
    async def go() -> int | None:
        try:
            status, _ = await probe(url)
        except OSError:  # not listening yet
            return None
        return status if status == 200 else None

    return go()


def _probe_unready(url: str) -> Any:
    async def go() -> tuple[int, dict[str, Any]] | None:
        try:
            answer = await probe(url)
        except OSError:  # not listening yet
            return None
        return answer if answer[0] == 503 else None

    return go()
