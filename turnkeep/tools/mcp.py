"""MCP servers as tool sources (``stdio``, ``http``, ``sse``): one long-lived ``fastmcp.Client``
per server, opened on first use and shared by every concurrent call (MCP multiplexes requests
over one session). A connection that fails is thrown away so the next call opens a fresh one; a
tool that merely reports an error is not a failure. How a server is started (command, URL) and
what it wrote to stderr go to the worker's log only, with its secrets redacted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import tempfile
from abc import abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import mcp.types
from fastmcp import Client
from fastmcp.client.transports import (
    ClientTransport,
    SSETransport,
    StdioTransport,
    StreamableHttpTransport,
)
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_MODERN_VERSION

from turnkeep.config.settings import McpServerSettings, Settings
from turnkeep.tools.failures import failure_reason, is_connection_failure, root_cause, start_failure
from turnkeep.tools.protocol_era import AskedKind, Outcome, fix_for, refused_request, with_fix
from turnkeep.tools.redaction import Redactor
from turnkeep.tools.server_requests import CURRENT_BOOK, RequestBook, Suspended
from turnkeep.tools.source import (
    ServerConnectionError,
    ServerUnavailable,
    ToolSource,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


# How much of a stdio server's stderr to log when it fails to start.
_STDERR_TAIL_CHARS = 2000


class McpSource(ToolSource):
    """A server reached over an MCP session: one long-lived ``fastmcp.Client``, opened on first
    use and shared by every concurrent call (MCP multiplexes requests over one session). A
    connection that fails is thrown away so the next call opens a fresh one. A server that may
    ask (elicitation, sampling) may get a second one, opened with the initialize handshake,
    for its tools that ask with requests of their own (``call_tool``)."""

    def __init__(
        self,
        name: str,
        *,
        init_timeout: float,
        redact: Redactor,
        request_timeout: float | None = None,
        protocol_mode: str = "auto",
    ) -> None:
        self.name = name
        self._protocol_mode = protocol_mode
        # fast-agent's protocol_mode, as fastmcp's Client takes it.
        self._mode = {"modern": LATEST_MODERN_VERSION}.get(protocol_mode, protocol_mode)
        self.redact = redact
        self._init_timeout = init_timeout
        # A tool call unanswered this long fails (fast-agent's `read_timeout_seconds`). Not
        # listings: a server's first answer may be slow on a loaded host, and retries cover it.
        self._request_timeout = request_timeout
        self._client: Client[Any] | None = None
        self._lock = asyncio.Lock()
        # Under `auto`, a tool that asks with a request of its own (`ctx.elicit`, the way
        # FastMCP's and MCP's docs show), which a 2026-07-28 connection cannot carry, runs on a
        # second connection opened with the initialize handshake, which can (`call_tool`).
        self._handshake: Client[Any] | None = None
        self._handshake_lock = asyncio.Lock()
        self._handshake_tools: set[str] = set()
        self._no_handshake = False
        self._closing: set[asyncio.Task[None]] = set()
        # Whether the server may ask the client something during a tool call (elicitation,
        # sampling): only then are the handlers installed and the capabilities advertised.
        self._asks_elicitation = False
        self._asks_sampling = False
        # On a connection older than 2026-07-28 a server's request does not say which call it
        # belongs to: such a server's calls run one at a time, under this lock, the running
        # call's book in `_serial_book`.
        self._serial = asyncio.Lock()
        self._serial_book: RequestBook | None = None

    @abstractmethod
    def _transport(self) -> ClientTransport:
        """A new transport for the next connection."""

    def describe(self) -> str:
        """How the server is reached, for the worker's log, secrets redacted:
        ``stdio: python weather.py --token ***``."""
        return self.kind

    def _stderr_tail(self) -> str:
        """What the server wrote to stderr while the last connection was opened."""
        return ""

    async def list_tools(self) -> list[mcp.types.Tool]:
        try:
            return await self._request("tools/list", lambda c: c.list_tools())
        except ServerConnectionError:
            # Listing is idempotent, so one immediate retry on a fresh connection is safe; it
            # spares a stale pooled connection (server restarted since) from failing a turn.
            return await self._request("tools/list", lambda c: c.list_tools())

    async def call_tool(
        self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> mcp.types.CallToolResult:
        """Raises ``ServerUnavailable`` (cannot open), ``ServerConnectionError`` (connection
        lost; not retried here because the tool may already have run), ``MCPError`` (the
        server answered with a JSON-RPC error) or ``CancelledError`` (the MCP client has sent
        the server a cancel notification; the connection stays usable)."""
        what = f"tools/call {tool}"

        def send(c: Client[Any]) -> Awaitable[mcp.types.CallToolResult]:
            return c.call_tool_mcp(tool, arguments, meta=meta, timeout=self._request_timeout)

        handshake = tool in self._handshake_tools
        outcome = await _outcome(self._call(what, send, handshake=handshake))
        kind = refused_request(outcome)
        if kind is not None and not handshake and self._may_retry_on_handshake(kind):
            # The tool ran up to its question and no further; it runs again, from its start,
            # on a connection that carries the question (as every answered question re-runs
            # it), and this tool goes there directly from now on.
            try:
                outcome = await _outcome(self._call(what, send, handshake=True))
            except ServerUnavailable as err:
                self._no_handshake = not err.transient
                log.warning(
                    "MCP server %r: %s asks with requests of its own, and no connection with "
                    "the initialize handshake could be opened: %s",
                    self.name,
                    tool,
                    err.reason,
                )
            else:
                self._handshake_tools.add(tool)
                log.info(
                    "MCP server %r: %s asks with requests of its own; it runs on a connection "
                    "opened with the initialize handshake",
                    self.name,
                    tool,
                )
                kind = refused_request(outcome)
        if kind is not None:
            outcome = with_fix(outcome, self._fix(kind))
        if isinstance(outcome, MCPError):
            raise outcome
        return outcome

    def _may_retry_on_handshake(self, kind: AskedKind) -> bool:
        """Whether a call refused a request of its server's own on a 2026-07-28 connection may
        run again on a handshake one: under `auto`, in a tool call that can be asked (a book),
        for what the server may ask."""
        asks = self._asks_elicitation if kind == "elicitation" else self._asks_sampling
        return (
            asks
            and self._protocol_mode == "auto"
            and not self._no_handshake
            and CURRENT_BOOK.get() is not None
            and self._client is not None
            and not _handshake_era(self._client)
        )

    def _fix(self, kind: AskedKind) -> str:
        enabled = self._asks_elicitation if kind == "elicitation" else self._asks_sampling
        fix = fix_for(self.name, kind, enabled=enabled, protocol_mode=self._protocol_mode)
        log.warning("MCP server %r: a tool's request of its own was refused; %s", self.name, fix)
        return fix

    async def _call(
        self, what: str, send: Callable[[Client[Any]], Awaitable[T]], *, handshake: bool
    ) -> T:
        book = CURRENT_BOOK.get()
        if book is None or not (self._asks_elicitation or self._asks_sampling):
            return await self._request(what, send, handshake=handshake)
        if not _handshake_era(await self._connected(handshake=handshake)):
            return await self._request(what, send, handshake=handshake)
        async with self._serial:
            self._serial_book = book
            try:
                return await self._request(what, send, handshake=handshake)
            finally:
                self._serial_book = None

    async def aclose(self) -> None:
        for client in (self._client, self._handshake):
            if client is not None:
                self._close_soon(client)
        self._client = self._handshake = None
        await asyncio.gather(*self._closing)

    # --- the connection ---------------------------------------------------------------------

    async def _request(
        self, what: str, send: Callable[[Client[Any]], Awaitable[T]], *, handshake: bool = False
    ) -> T:
        client = await self._connected(handshake=handshake)
        try:
            return await send(client)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            if not is_connection_failure(err):
                raise
            reason = self.redact(failure_reason(err))
            log.warning(
                "MCP server %r: %s failed, reconnecting next time: %s: %s",
                self.name,
                what,
                type(root_cause(err)).__name__,
                reason,
            )
            await self._discard(client)
            raise ServerConnectionError(self.name, self.kind, reason) from err

    async def _connected(self, *, handshake: bool = False) -> Client[Any]:
        """The open connection (``handshake``: the one opened with the initialize handshake,
        for tools that ask with requests of their own), opened if need be."""
        client = self._handshake if handshake else self._client
        if client is not None and client.is_connected():
            return client
        async with self._handshake_lock if handshake else self._lock:
            client = self._handshake if handshake else self._client
            if client is not None and client.is_connected():
                return client
            if client is not None:
                await self._discard(client)
            client = await self._open("legacy" if handshake else self._mode)
            if handshake:
                self._handshake = client
            else:
                self._client = client
            return client

    async def _discard(self, client: Client[Any]) -> None:
        # Concurrent failures on one connection all land here; only the first closes it, and a
        # connection that another call already replaced is left alone.
        if self._client is client:
            self._client = None
        elif self._handshake is client:
            self._handshake = None
        else:
            return
        await asyncio.shield(self._close_soon(client))

    def _close_soon(self, client: Client[Any]) -> asyncio.Task[None]:
        # A task of its own, so a caller cancelled while waiting for the close (a stdio
        # server gets seconds to exit) cannot leave a server process half shut down.
        task = asyncio.create_task(_close_client(client))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task

    def _book(self, client: Client[Any] | None) -> RequestBook | None:
        """The book of the call a server's request on ``client`` belongs to
        (``server_requests``)."""
        if client is not None and _handshake_era(client):
            return self._serial_book
        return CURRENT_BOOK.get()

    async def _on_elicit(self, client: Client[Any] | None, params: Any) -> Any:
        book = self._book(client)
        if book is None:  # no call of ours is running: nobody to ask
            return mcp.types.ElicitResult(action="cancel")
        try:
            return book.elicit(params)
        except Suspended:
            if client is not None and _handshake_era(client):
                # The server's tool goes on with a cancel and its result is set aside; the
                # call runs again once the answer is in.
                return mcp.types.ElicitResult(action="cancel")
            raise  # ends the call: the SDK sends the server nothing more for it

    async def _on_sample(self, client: Client[Any] | None, params: Any) -> Any:
        book = self._book(client)
        if book is None:
            raise RuntimeError("no tool call of this client is running")
        return book.sample(params)

    async def _open(self, mode: str) -> Client[Any]:
        # Each connection's handlers know which connection asked: a request's era, and so the
        # call it belongs to, is that connection's.
        opened: Client[Any] | None = None

        async def on_elicit(message: str, kind: Any, params: Any, context: Any) -> Any:
            del message, kind, context
            return await self._on_elicit(opened, params)

        async def on_sample(messages: Any, params: Any, context: Any) -> Any:
            del messages, context
            return await self._on_sample(opened, params)

        handlers: dict[str, Any] = {}
        if self._asks_elicitation:
            handlers["elicitation_handler"] = on_elicit
        if self._asks_sampling:
            handlers["sampling_handler"] = on_sample
        client: Client[Any] = Client(
            self._transport(),
            name=f"turnkeep:{self.name}",
            init_timeout=self._init_timeout,
            mode=mode,
            **handlers,
        )
        opened = client
        try:
            async with asyncio.timeout(self._init_timeout):
                await client.__aenter__()
        except asyncio.CancelledError:
            self._close_soon(client)
            raise
        except Exception as err:
            await asyncio.shield(self._close_soon(client))
            reason, transient = start_failure(err, self.kind, self._init_timeout)
            # The whole story, for the worker's log only: the failure itself reaches history.
            # Its first line (all that `run` and `chat` show) ends with the server's last
            # words, which usually say why (a missing module, a bad argument).
            tail = self._stderr_tail()
            last = tail.splitlines()[-1].strip() if tail else ""
            stderr = f"\n--- server stderr (last lines) ---\n{tail}" if tail else ""
            log.warning(
                "MCP server %r (%s) could not be started: %s (%s: %s)%s%s",
                self.name,
                self.describe(),
                reason,
                type(root_cause(err)).__name__,
                self.redact(failure_reason(err)),
                self.redact(f"; its stderr ends: {last}") if last else "",
                self.redact(stderr),
            )
            raise ServerUnavailable(self.name, self.kind, reason, transient=transient) from err
        log.info("MCP server %r connected (%s)", self.name, self.describe())
        return client


class _ConfiguredSource(McpSource):
    """An ``mcp.servers`` entry's MCP server."""

    def __init__(self, name: str, config: McpServerSettings) -> None:
        super().__init__(
            name,
            init_timeout=config.init_timeout,
            redact=Redactor.of(config),
            request_timeout=config.read_timeout_seconds,
            protocol_mode=config.protocol_mode,
        )
        self._config = config
        elicitation, sampling = config.elicitation, config.sampling
        self._asks_elicitation = elicitation is not None and elicitation.mode != "none"
        self._asks_sampling = sampling is not None and sampling.enabled

    @classmethod
    def from_config(cls, name: str, config: McpServerSettings, settings: Settings) -> ToolSource:
        del settings  # the entry says it all
        return cls(name, config)

    def describe(self) -> str:
        cfg = self._config
        where = shlex.join([cfg.command or "", *cfg.args]) if self.kind == "stdio" else cfg.url
        return f"{self.kind}: {self.redact(where or '')}"


class StdioSource(_ConfiguredSource):
    """A server the worker runs as a subprocess, one per worker, talking over its stdio."""

    kind = "stdio"

    def __init__(self, name: str, config: McpServerSettings, cwd: Path | None = None) -> None:
        """``cwd``: where the server runs (``config.cwd`` resolved against the config file's
        directory); None: the worker's own."""
        super().__init__(name, config)
        assert config.command is not None  # guaranteed by McpServerSettings
        self._command = config.command
        self._cwd = cwd
        # One append-only file for the source's lifetime: its tail explains a server that dies
        # while starting, and the history of earlier crashes stays readable.
        self._stderr_dir: tempfile.TemporaryDirectory[str] | None = None
        self._stderr_start = 0

    @classmethod
    def from_config(cls, name: str, config: McpServerSettings, settings: Settings) -> ToolSource:
        return cls(name, config, settings.path(config.cwd) if config.cwd else None)

    def _transport(self) -> ClientTransport:
        cfg = self._config
        return StdioTransport(
            self._command,
            list(cfg.args),
            env=dict(cfg.env) if cfg.env else None,
            cwd=str(self._cwd) if self._cwd is not None else None,
            # The source owns the lifetime: closing the client must end the process.
            keep_alive=False,
            log_file=self._stderr_file(),
        )

    def _stderr_file(self) -> Path:
        if self._stderr_dir is None:
            self._stderr_dir = tempfile.TemporaryDirectory(prefix="turnkeep-mcp-")
        path = Path(self._stderr_dir.name) / f"{self.name}.stderr.log"
        path.touch()
        self._stderr_start = path.stat().st_size
        return path

    def _stderr_tail(self) -> str:
        if self._stderr_dir is None:
            return ""
        return _read_tail(
            Path(self._stderr_dir.name) / f"{self.name}.stderr.log", self._stderr_start
        )

    async def aclose(self) -> None:
        await super().aclose()
        if self._stderr_dir is not None:
            self._stderr_dir.cleanup()
            self._stderr_dir = None


class HttpSource(_ConfiguredSource):
    """A server at a URL, over MCP's streamable HTTP transport."""

    kind = "http"

    def __init__(self, name: str, config: McpServerSettings) -> None:
        super().__init__(name, config)
        assert config.url is not None  # guaranteed by McpServerSettings
        self._url = config.url

    def _transport(self) -> ClientTransport:
        return StreamableHttpTransport(self._url, headers=self._config.headers)


class SseSource(HttpSource):
    """A server at a URL, over MCP's older SSE transport."""

    kind = "sse"

    def _transport(self) -> ClientTransport:
        return SSETransport(self._url, headers=self._config.headers)


def _handshake_era(client: Client[Any]) -> bool:
    """Whether the connection is older than 2026-07-28 (servers then send requests of their
    own during a call, rather than returning them as the call's result)."""
    version = getattr(client.session, "protocol_version", None)
    return version is None or str(version) in HANDSHAKE_PROTOCOL_VERSIONS


async def _outcome(call: Awaitable[mcp.types.CallToolResult]) -> Outcome:
    """The call's result, or the JSON-RPC error the server answered with."""
    try:
        return await call
    except MCPError as err:
        return err


async def _close_client(client: Client[Any]) -> None:
    # Closing re-raises whatever killed the session; the point here is only to release the
    # process or sockets, so a failing or slow close must not mask the error that matters.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(10):
            await client.close()


def _read_tail(path: Path, start: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(start)
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()[-_STDERR_TAIL_CHARS:]
