"""The health endpoint (``turnkeep.worker.health``) over real HTTP, with a real worker on the
test server: ``/healthz`` answers whenever the process runs, ``/readyz`` only while the worker
polls and Temporal answers. The probes of a ``turnkeep worker`` process across SIGTERM are in
``tests.test_shutdown``."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.conftest import eventually, make_settings
from turnkeep import build_worker
from turnkeep.worker.health import HealthError, HealthServer, WorkerState, parse_address


def _get(url: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def probe(url: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(_get, url, method)


async def test_probes_follow_the_worker_from_start_to_shutdown(
    client: Client, tmp_path: Path
) -> None:
    state = WorkerState()
    async with HealthServer("127.0.0.1:0", state) as server:
        assert server.url is not None
        healthz, readyz = f"{server.url}/healthz", f"{server.url}/readyz"
        assert await probe(healthz) == (200, {"status": "ok"})
        assert await probe(readyz) == (503, {"status": "not ready", "reason": "starting"})
        state.connecting()
        assert (await probe(readyz))[1]["reason"] == "connecting to Temporal"

        worker = build_worker(client, make_settings(tmp_path), task_queue=f"t-{uuid.uuid4().hex}")
        async with worker:
            await eventually(lambda: worker.is_running, "the worker runs")
            state.polling(worker)
            assert await probe(readyz) == (200, {"status": "ready"})
            assert await probe(healthz) == (200, {"status": "ok"})
            state.shutting_down()
            assert await probe(readyz) == (503, {"status": "not ready", "reason": "shutting down"})
        # Alive while it drains and after: only readiness changed.
        assert await probe(healthz) == (200, {"status": "ok"})
        assert (await probe(readyz))[0] == 503

        assert (await probe(f"{server.url}/metrics"))[0] == 404
        assert (await probe(readyz, method="POST"))[0] == 405


async def test_readiness_needs_temporal_to_answer(client: Client, tmp_path: Path) -> None:
    """A polling worker whose Temporal frontend stops answering is not ready."""
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    unreachable = await Client.connect(dead, lazy=True)
    worker = build_worker(client, make_settings(tmp_path), task_queue=f"t-{uuid.uuid4().hex}")
    state = WorkerState(reuse_check_for=0)  # every probe asks Temporal
    async with HealthServer("127.0.0.1:0", state) as server, worker:
        await eventually(lambda: worker.is_running, "the worker runs")
        state.polling(worker)
        assert await probe(f"{server.url}/readyz") == (200, {"status": "ready"})
        # The worker's own connection, as if the frontend went away under it.
        state._client = unreachable
        status, body = await probe(f"{server.url}/readyz")
        assert status == 503
        assert body["reason"].startswith("Temporal unreachable (")
        assert dead not in body["reason"]  # no addresses in answers


def test_health_addresses() -> None:
    assert parse_address("0.0.0.0:8080") == ("0.0.0.0", 8080)
    assert parse_address(":9000") == ("0.0.0.0", 9000)
    assert parse_address("[::1]:8080") == ("::1", 8080)
    for bad in ("8080", "host:port", "host:70000", ""):
        with pytest.raises(HealthError):
            parse_address(bad)


async def test_a_taken_address_is_a_clear_error() -> None:
    async with HealthServer("127.0.0.1:0", WorkerState()) as first:
        assert first.url is not None
        with pytest.raises(HealthError, match="cannot listen"):
            async with HealthServer(first.url.removeprefix("http://"), WorkerState()):
                pass
