"""Run ``turnkeep worker`` as a separate OS process, so tests can SIGKILL it like a crash would.

Each worker runs ``python -m turnkeep.cli worker --config FILE --address ADDR``. ``kill()``
SIGKILLs only the worker process itself, as an OOM kill or a crash would: its stdio MCP servers
(in sessions of their own) see their stdin close and exit by themselves. ``close()`` SIGKILLs
the workers still running and any MCP server they started that is still alive, found by a
marker in its environment (``effects_server`` passes the worker's ``$TURNKEEP_TEST_FLEET`` on),
so nothing a test started outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

REPO = Path(__file__).resolve().parents[1]
IDEMPOTENT_SERVER = Path(__file__).with_name("mcp_servers_idempotent.py")
FLEET_ENV = "TURNKEEP_TEST_FLEET"


def write_config(path: Path, config: dict[str, Any]) -> Path:
    """A turnkeep.yaml for a worker process (JSON is YAML)."""
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


def effects_server(record: Path) -> dict[str, Any]:
    """``mcp.servers`` entry for the stdio server whose ``effect`` tool logs to ``record``."""
    return {
        "command": sys.executable,
        "args": [str(IDEMPOTENT_SERVER)],
        # Expanded by the worker from its own environment: marks the server as the fleet's.
        "env": {"TURNKEEP_TEST_RECORD": str(record), FLEET_ENV: f"${{{FLEET_ENV}:}}"},
    }


class WorkerProcesses:
    """Worker processes for one task queue; a context manager that cleans up all of them."""

    def __init__(self, config: Path, address: str, logs: Path, namespace: str = "default") -> None:
        self.config = config
        self.address = address
        self.namespace = namespace
        self.logs = logs
        self.running: dict[int, subprocess.Popen[bytes]] = {}
        self.killed: dict[int, float] = {}  # pid -> time.time() of the SIGKILL
        self.started = 0
        self._marker = f"{FLEET_ENV}={uuid.uuid4().hex}".encode()

    def start(self, *args: str) -> int:
        """Start one more worker process, with ``args`` after ``worker``'s own; returns its pid
        (not yet polling: see wait_polling)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"worker-{self.started}.log"
        self.started += 1
        argv = [sys.executable, "-m", "turnkeep.cli", "worker", "--config", str(self.config)]
        argv += ["--address", self.address, "--namespace", self.namespace, *args]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**os.environ, FLEET_ENV: self._marker.decode().partition("=")[2]},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.running[proc.pid] = proc
        return proc.pid

    async def wait_polling(
        self, client: Client, task_queue: str, pid: int, within: float = 60.0
    ) -> None:
        """Return once worker ``pid`` polls ``task_queue`` for workflow and activity tasks."""
        deadline = time.monotonic() + within
        while True:
            proc = self.running.get(pid)
            if proc is None or proc.poll() is not None:
                raise AssertionError(f"worker {pid} exited; log:\n{self.log_tail()}")
            if await _polls(client, task_queue, pid):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {pid} did not poll within {within} s")
            await asyncio.sleep(0.1)

    async def start_polling(self, client: Client, task_queue: str) -> int:
        pid = self.start()
        await self.wait_polling(client, task_queue, pid)
        return pid

    def kill(self, pid: int) -> None:
        """SIGKILL one worker process (only it: its MCP servers are orphaned, as in a crash)."""
        proc = self.running.pop(pid)
        proc.kill()
        self.killed[pid] = time.time()
        proc.wait()

    def stop(self, pid: int) -> None:
        """Stop one worker the orderly way (SIGTERM: it finishes its tasks and exits)."""
        proc = self.running.pop(pid)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """SIGKILL every worker still running, and every process left that carries this
        fleet's marker (MCP servers of killed workers that have not exited yet)."""
        for proc in self.running.values():
            proc.kill()
            proc.wait()
        self.running.clear()
        for pid in _marked(self._marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def log_tail(self, chars: int = 3000) -> str:
        text = "".join(
            f"--- {log.name}\n{log.read_text(errors='replace')}"
            for log in sorted(self.logs.glob("worker-*.log"))
        )
        return text[-chars:]

    def __enter__(self) -> WorkerProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _marked(marker: bytes) -> list[int]:
    """Pids of live processes with ``marker`` (``NAME=value``) in their environment (Linux)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = environ.read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if marker in variables:
            found.append(int(environ.parent.name))
    return found


# A busy dev server may cancel or time out a describe call (seen: "operation was canceled"
# while a worker was starting): that is "not yet", asked again by ``wait_polling``.
_TRANSIENT = (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE)


async def _polls(client: Client, task_queue: str, pid: int) -> bool:
    identity = f"{pid}@"
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        try:
            described = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace,
                    task_queue=TaskQueue(name=task_queue),
                    task_queue_type=kind,
                )
            )
        except RPCError as err:
            if err.status in _TRANSIENT:
                return False
            raise
        if not any(p.identity.startswith(identity) for p in described.pollers):
            return False
    return True
