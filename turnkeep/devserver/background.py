"""Processes that outlive the command that starts them: the background dev server
(``turnkeep/worker/embedded.py``) and codec server (``turnkeep/worker/codec_server.py``).
Spawning one, telling whether it is alive, stopping it, and the lock under which `turnkeep`
invocations manage them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

STOP_GRACE_SECONDS = 5.0


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
            (os.POSIX_SPAWN_OPEN, 1, str(log_file), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
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


def acquire_state_lock(directory: Path) -> IO[str]:
    """Blocks until this process holds ``directory``'s lock. It serialises concurrent `turnkeep`
    invocations so they share one server instead of racing to start two on the same
    database."""
    f = (directory / "server.lock").open("w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def release_state_lock(f: IO[str]) -> None:
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
