"""A small ASGI app served by uvicorn in the running event loop: the codec server, the health
endpoint and the live-stream server all run this way, on a socket bound here."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from typing import Any

import uvicorn


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free one); raises ``OSError``. Bound here
    rather than by uvicorn, whose bind failure exits the whole process."""
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets that say they
    # are TCP, and the accepted connections inherit it. Without it, a response written in two
    # parts (head, then body) waits for the client's delayed ACK, some 40 ms on Linux.
    sock = socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (binding as a server would, so a socket
    lingering in TIME_WAIT does not count)."""
    try:
        bind(host, port).close()
    except OSError:
        return True
    return False


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The process that embeds the server (the worker, the CLI, pytest) owns SIGINT/SIGTERM.
        yield


class AsgiServer:
    """``app`` served on a bound socket until ``stop()``."""

    def __init__(self, app: Any, *, name: str, graceful_shutdown: int = 1) -> None:
        self.name = name
        self._config = uvicorn.Config(
            app,
            log_level="warning",
            # No logging set-up of uvicorn's own: its lines go through the CLI's handler
            # (text or JSON) like every other line.
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=graceful_shutdown,
        )
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    async def start(self, sock: socket.socket) -> int:
        """Serves on ``sock`` once uvicorn has started; returns the port."""
        self._server = server = _Uvicorn(self._config)
        self._task = task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise RuntimeError(f"the {self.name} stopped while starting")
            await asyncio.sleep(0.01)
        port: int = sock.getsockname()[1]
        return port

    async def stop(self) -> None:
        server, task, self._server, self._task = self._server, self._task, None, None
        if server is not None and task is not None:
            server.should_exit = True
            await task
