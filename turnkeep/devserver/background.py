"""Processes that outlive the command that starts them: the background dev server and codec
server. ``BackgroundProcess`` is one of them, known by its record in the state directory:
spawning it, telling whether the recorded process is alive and really it, stopping it, and the
lock under which `turnkeep` invocations manage them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import IO, Any

from turnkeep.config.paths import GROUP_AND_OTHER_BITS, OWNER_ONLY_FILE_MODE, state_dir

STOP_GRACE_SECONDS = 5.0


class BackgroundProcess:
    """A detached process of turnkeep's state directory: its record is ``NAME.json`` (its pid,
    its log and what its starter adds), its output goes to ``NAME.log``, and ``marker`` is in
    its command line. Every method but ``locked()`` and ``stop()`` expects the caller to hold
    ``locked()``."""

    def __init__(self, name: str, *, marker: bytes) -> None:
        self.name = name
        self.marker = marker

    @property
    def record_path(self) -> Path:
        return state_dir() / f"{self.name}.json"

    @property
    def log_file(self) -> Path:
        return state_dir() / f"{self.name}.log"

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Holds the state directory's lock (one for every background process), waiting for it
        off the event loop."""
        lock = await asyncio.to_thread(_acquire_state_lock, state_dir())
        try:
            yield
        finally:
            _release_state_lock(lock)

    def read(self) -> dict[str, Any] | None:
        """The record, if there is one that names a pid."""
        try:
            record = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and isinstance(record.get("pid"), int) else None

    def running(self) -> dict[str, Any] | None:
        """The record, if its process is alive and is this one."""
        record = self.read()
        return record if record is not None and self.alive(record["pid"]) else None

    def alive(self, pid: int) -> bool:
        return pid_alive(pid) and self._is_ours(pid)

    def new_log(self) -> Path:
        """The log, emptied: one log per start, the old one only explains an old failure. Only
        its owner reads it, as it may quote what the process handled."""
        fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, OWNER_ONLY_FILE_MODE)
        try:
            os.fchmod(fd, OWNER_ONLY_FILE_MODE)  # made before turnkeep tightened it
        finally:
            os.close(fd)
        return self.log_file

    def start(
        self, argv: list[str], env: Mapping[str, str] | None = None, /, **fields: Any
    ) -> dict[str, Any]:
        """Spawns ``argv`` detached with ``env`` (default: ours), logging to ``log_file``, and
        records it with ``fields`` before it is ready, so ``stop()`` finds a process that never
        gets there. Returns the record."""
        # The umask makes what the process creates its owner's only: the dev server's database,
        # with its WAL and shared-memory files, holds every conversation.
        previous = os.umask(GROUP_AND_OTHER_BITS)
        try:
            pid = spawn_detached(argv, self.log_file, env)
        finally:
            os.umask(previous)
        record = {"pid": pid, "log_file": str(self.log_file), **fields}
        # Its owner's only from the start, as the log: what a starter records is its own business
        # (the codec server's fingerprint of its keys, say).
        fd = os.open(self.record_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, OWNER_ONLY_FILE_MODE)
        with os.fdopen(fd, "w") as f:
            # an older record, made by a more generous umask
            os.fchmod(f.fileno(), OWNER_ONLY_FILE_MODE)
            f.write(json.dumps(record, indent=2) + "\n")
        return record

    def forget(self) -> None:
        self.record_path.unlink(missing_ok=True)

    def abandon(self, pid: int) -> None:
        """Stops a process that did not get ready, and forgets it."""
        terminate(pid)
        self.forget()

    def stop(self) -> bool:
        """Stops the recorded process (under the lock); False if none was running, or the
        recorded pid is now another process's."""
        lock = _acquire_state_lock(state_dir())
        try:
            record = self.read()
            self.forget()
            if record is None or not self.alive(record["pid"]):
                return False
            terminate(record["pid"])
            return True
        finally:
            _release_state_lock(lock)

    def _is_ours(self, pid: int) -> bool:
        # Guards against a recycled pid (e.g. after a reboot). Without /proc (macOS) the
        # readiness check that follows a reuse is the only guard.
        cmdline = Path(f"/proc/{pid}/cmdline")
        if not cmdline.parent.exists():
            return True
        try:
            return self.marker in cmdline.read_bytes()
        except OSError:
            return False


def spawn_detached(argv: list[str], log_file: Path, env: Mapping[str, str] | None = None) -> int:
    """Start ``argv`` in its own session, output to ``log_file``, with ``env`` (default: ours)."""
    # posix_spawn rather than Popen: a Popen object that is dropped while its process runs warns
    # and is polled by later Popen calls; this server is deliberately never waited for.
    return os.posix_spawn(
        argv[0],
        argv,
        dict(os.environ if env is None else env),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            # A log may quote what the server handled: only its owner reads it.
            (
                os.POSIX_SPAWN_OPEN,
                1,
                str(log_file),
                os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                OWNER_ONLY_FILE_MODE,
            ),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        # A new session keeps the CLI's Ctrl-C and terminal hangup away from the server.
        setsid=True,
    )


def detached_exit_code(pid: int) -> int | None:
    """The exit code of our detached child if it has exited (reaping it), else None."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # already reaped
        return -1
    return os.waitstatus_to_exitcode(status) if reaped == pid else None


def pid_alive(pid: int) -> bool:
    # If the server is our own child (tests, or the CLI right after starting it), a dead one
    # stays a zombie that signal 0 still reports as alive until it is reaped.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _acquire_state_lock(directory: Path) -> IO[str]:
    """Blocks until this process holds ``directory``'s lock. It serialises concurrent `turnkeep`
    invocations so they share one server instead of racing to start two on the same
    database."""
    f = (directory / "server.lock").open("w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def _release_state_lock(f: IO[str]) -> None:
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()


def terminate(pid: int, grace: float = STOP_GRACE_SECONDS) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, grace):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, grace)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
