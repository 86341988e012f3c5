"""The health endpoint of ``turnkeep worker --health HOST:PORT``, for an orchestrator's probes.

- ``GET /healthz``: 200 while the process lives and its event loop answers (the loop itself
  serves the request, so a blocked loop is a probe that times out). For a liveness probe.
- ``GET /readyz``: 200 only while the worker polls its task queue and Temporal answers;
  otherwise 503 with a short JSON reason: starting, connecting, shutting down, or Temporal
  unreachable. It turns 503 the moment SIGTERM arrives, before the worker has drained. For a
  readiness probe.

A Starlette app served like the codec server (``AsgiServer``): uvicorn on a socket bound here,
in the worker's own event loop, leaving signals to the worker. The answers hold no
configuration, only states and SDK error class names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import timedelta
from typing import Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from turnkeep.config.files import ConfigError
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.support.lifecycle import AsyncStartStop

log = logging.getLogger(__name__)

# A readiness answer reuses the last check of the Temporal connection for this long, so probes
# from several places (kubelet, a load balancer) cost the frontend one call a second at most.
CHECK_REUSE_SECONDS = 1.0
# A frontend that takes longer than this to answer counts as unreachable.
CHECK_TIMEOUT = timedelta(seconds=3)


class HealthError(ConfigError):
    """The health endpoint cannot start: a bad address, or one that is taken."""


def parse_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6; an empty host is every IPv4 address)."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise HealthError(f"the health address must be HOST:PORT, e.g. 0.0.0.0:8080, not {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class Polling(Protocol):
    """What the probes watch: a ``Worker``, or the ``TurnkeepWorkers`` of a process."""

    @property
    def is_running(self) -> bool: ...

    @property
    def client(self) -> Client: ...


class WorkerState:
    """What the probes report: the worker's phase, set by ``WorkerService``."""

    def __init__(self, *, reuse_check_for: float = CHECK_REUSE_SECONDS) -> None:
        self.phase = "starting"
        self._reuse_check_for = reuse_check_for
        self._worker: Polling | None = None
        self._client: Client | None = None
        self._checked_at = float("-inf")
        self._reachable: str | None = None  # None: reachable; else why not
        self._check: asyncio.Task[str | None] | None = None

    def connecting(self) -> None:
        self.phase = "connecting to Temporal"

    def polling(self, worker: Polling) -> None:
        self._worker = worker
        self._client = worker.client
        self.phase = "polling"

    def shutting_down(self) -> None:
        self.phase = "shutting down"

    async def readiness(self) -> str | None:
        """None when ready, else the reason it is not."""
        if self.phase != "polling":
            return self.phase
        if self._worker is None or not self._worker.is_running:
            return "worker not running"
        return await self._temporal_reachable()

    async def _temporal_reachable(self) -> str | None:
        if time.monotonic() - self._checked_at < self._reuse_check_for:
            return self._reachable
        if self._check is None:  # probes that arrive together share one call
            self._check = asyncio.create_task(self._ask_temporal())
            self._check.add_done_callback(self._checked)
        # Shielded: a probe that hangs up must not cancel the call the others wait for.
        return await asyncio.shield(self._check)

    def _checked(self, check: asyncio.Task[str | None]) -> None:
        self._check = None
        if not check.cancelled():
            self._reachable, self._checked_at = check.result(), time.monotonic()

    async def _ask_temporal(self) -> str | None:
        assert self._client is not None
        try:
            await self._client.workflow_service.get_system_info(
                GetSystemInfoRequest(), timeout=CHECK_TIMEOUT
            )
        except Exception as err:
            # The class only: an RPC error's text may name the server's address or namespace.
            return f"Temporal unreachable ({type(err).__name__})"
        return None


def _app(state: WorkerState) -> Starlette:
    """Two GET routes (and HEAD), JSON answers, nothing cached by proxies."""

    async def healthz(request: Request) -> Response:
        return _answer(200, {"status": "ok"})

    async def readyz(request: Request) -> Response:
        reason = await state.readiness()
        if reason is None:
            return _answer(200, {"status": "ready"})
        return _answer(503, {"status": "not ready", "reason": reason})

    async def refused(request: Request, exc: Exception) -> Response:
        # A probe only reads: any other method is 405, on any path.
        if request.method not in ("GET", "HEAD"):
            return _answer(405, {"status": "method not allowed"})
        return _answer(404, {"status": "not found"})

    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ],
        exception_handlers={404: refused, 405: refused},
    )
    app.router.redirect_slashes = False  # /healthz/ is not found, not redirected
    return app


def _answer(status: int, body: dict[str, str]) -> Response:
    # A HEAD request gets the same headers without the body (uvicorn drops it).
    return Response(
        (json.dumps(body) + "\n").encode(),
        status,
        headers={"cache-control": "no-store"},
        media_type="application/json",
    )


class HealthServer(AsyncStartStop["HealthServer"]):
    """The endpoint in the running event loop, served by ``async with`` (or ``start()`` and
    ``stop()``); port 0 picks a free port (``url`` then says which)."""

    def __init__(self, address: str, state: WorkerState) -> None:
        self.host, self.port = parse_address(address)
        self.state = state
        self.url: str | None = None
        self._server = AsgiServer(_app(state), name="health endpoint")

    async def start(self) -> HealthServer:
        try:
            sock = bind(self.host, self.port)
        except OSError as err:
            raise HealthError(
                f"the health endpoint cannot listen on {self.host}:{self.port}: {err}"
            ) from None
        port = await self._server.start(sock)
        self.url = http_url(self.host, port)
        log.info("health endpoint on %s (/healthz, /readyz)", self.url)
        return self

    async def stop(self) -> None:
        await self._server.stop()
