"""The worker's tool sources (``turnkeep/activities/tool_sources.py``): the built-in kinds, their
registry, and ``McpPool``, which holds one source per server for the life of a worker process.

An MCP server (``stdio``, ``http``, ``sse``) keeps one long-lived ``fastmcp.Client``, opened on
first use and shared by every concurrent call (MCP multiplexes requests over one session). A
connection that fails is thrown away so the next call opens a fresh one; a tool that merely
reports an error is not a failure. Failures name a server by its config name and transport
only: they reach the workflow history, the model and the CLI. How it is started (command, URL)
and what it wrote to stderr go to the worker's log, with its secrets redacted (``Redactor``).
Function tools are served by an in-process FastMCP server that is called directly, without an
MCP session, unless a tool asks for FastMCP's ``Context``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import logging
import os
import re
import shlex
import sys
import tempfile
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx2
import mcp.types
from fastmcp import Client, FastMCP
from fastmcp.client.transports import (
    ClientTransport,
    FastMCPTransport,
    SSETransport,
    StdioTransport,
    StreamableHttpTransport,
)
from fastmcp.exceptions import DisabledError, FastMCPError, NotFoundError, ToolError
from fastmcp.server.dependencies import without_injected_parameters
from fastmcp.tools import Tool, ToolResult
from fastmcp.utilities.versions import VersionSpec, dedupe_with_versions
from mcp.shared.exceptions import MCPError

from turnkeep.activities.entry_points import register_installed
from turnkeep.activities.tool_sources import (
    ServerConnectionError,
    ServerUnavailable,
    ToolSource,
    UnknownServer,
)
from turnkeep.errors import known
from turnkeep.settings import McpServerSettings, Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# How much of a stdio server's stderr to log when it fails to start.
_STDERR_TAIL_CHARS = 2000
# Function-tool servers live in this process; they start at once.
_FUNCTION_SERVER_INIT_TIMEOUT = 30.0
FUNCTION_TOOLS = "function tools"

REDACTED = "***"
# Names of options, variables and query keys whose value is a credential: `--token X`,
# `--api-key=X`, `PASSWORD=X`, `$GITHUB_TOKEN`.
_SECRET_NAME = re.compile(r"token|key|secret|passw|auth|credential|cookie", re.IGNORECASE)
# Shorter values are no secret worth hiding, and replacing them would garble unrelated text.
_MIN_SECRET_CHARS = 4
# Anything URL-like in free text: HTTP libraries quote the URL they failed on.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


@dataclass(frozen=True)
class Redactor:
    """Hides one server's secrets in text bound for the worker's log or a failure: its ``env``
    and ``headers`` values, its URL's userinfo and query values, ``args`` given to a
    secret-named option (``--token X``, ``--api-key=X``), and the values of secret-named
    environment variables its command, args, URL or headers contain (what ``${API_KEY}``
    expanded to). URLs anywhere in the text lose their userinfo and query values too."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg: McpServerSettings) -> Redactor:
        found = set((cfg.env or {}).values())
        for value in (cfg.headers or {}).values():
            found.add(value)
            found.update(value.split()[-1:])  # the X of "Bearer X", which a server may echo
        found.update(_url_secrets(cfg.url or ""))
        found.update(_arg_secrets(cfg.args))
        given = [cfg.command or "", *cfg.args, cfg.url or "", *(cfg.headers or {}).values()]
        found.update(
            value
            for name, value in os.environ.items()
            if _SECRET_NAME.search(name) and any(value and value in g for g in given)
        )
        # Longest first, so a secret containing another is hidden whole.
        kept = sorted((s for s in found if len(s) >= _MIN_SECRET_CHARS), key=len, reverse=True)
        return cls(tuple(kept))

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return _redact_urls(text)


class _UrlRedactingFilter(logging.Filter):
    """httpx logs every request's URL at INFO (``HTTP Request: POST https://…?api_key=…``):
    a worker logging at INFO would write an HTTP server's secrets. Only its URLs are rewritten."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _redact_urls(record.getMessage())
        record.args = None
        return True


logging.getLogger(httpx2.__name__).addFilter(_UrlRedactingFilter())


def _url_secrets(url: str) -> Iterator[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    yield from (v for v in (parts.username, parts.password, parts.fragment) if v)
    for _, value in parse_qsl(parts.query, keep_blank_values=True):
        yield value


def _arg_secrets(args: Sequence[str]) -> Iterator[str]:
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if eq and _SECRET_NAME.search(name):
            yield value
        elif not eq and arg.startswith("-") and _SECRET_NAME.search(arg) and i + 1 < len(args):
            yield args[i + 1]


def _redact_urls(text: str) -> str:
    return _URL_IN_TEXT.sub(lambda m: _redact_url(m[0]), text)


def _redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return f"{url.partition('://')[0]}://{REDACTED}"
    netloc = f"{REDACTED}@" if "@" in parts.netloc else ""
    netloc += f"[{host}]" if ":" in host else host
    netloc += f":{port}" if port is not None else ""
    query = "&".join(
        f"{key}={REDACTED}" for key, _ in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, REDACTED if parts.fragment else ""))


def _is_connection_failure(err: BaseException) -> bool:
    # A JSON-RPC error is the server answering; anything else (transport errors, closed
    # streams, a dead session task) means the connection can no longer be trusted.
    if isinstance(err, MCPError):
        return _is_connection_closed(err)
    return isinstance(err, Exception)


def _causes(err: BaseException) -> list[BaseException]:
    """``err`` and what caused it, outermost first, stopping short of a cancellation (which
    is how asyncio's timeouts are implemented, not a reason anyone needs to read)."""
    chain = [err]
    while (cause := chain[-1].__cause__) is not None and isinstance(cause, Exception):
        chain.append(cause)
    return chain


def _causes_and_contexts(err: BaseException) -> list[BaseException]:
    chain = [err]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None:
        if cause in chain:
            break
        chain.append(cause)
    return chain


def _root_cause(err: BaseException) -> BaseException:
    # fastmcp wraps transport errors ("Client failed to connect: ..."); the root reads better.
    return _causes(err)[-1]


def _is_connection_closed(err: BaseException) -> bool:
    return isinstance(err, MCPError) and err.code == mcp.types.CONNECTION_CLOSED


def _reason(err: BaseException) -> str:
    root = _root_cause(err)
    if _is_connection_closed(root):
        return "the connection was closed"
    return str(root).strip() or type(root).__name__


def _start_failure(err: BaseException, transport: str, init_timeout: float) -> tuple[str, bool]:
    """Why a server did not start, in words that quote neither its command nor its URL, and
    whether trying again may help: a network failure or a timeout may pass; a command that
    cannot run, a server that exits while starting, or an HTTP 4xx will not."""
    root = _root_cause(err)
    # Implicit contexts too: anyio and httpcore re-raise a refused connection without `from`.
    causes = _causes_and_contexts(err)
    if any(isinstance(e, TimeoutError) for e in _causes(err)):
        return f"no answer to initialize within {init_timeout:g} s", True
    if transport == "stdio":
        if _is_connection_closed(root):
            return "the server exited before initialization completed", False
        if isinstance(root, OSError) and root.strerror:
            # Not str(root), which may name the command.
            return f"its command could not be run: {root.strerror}", False
        return f"it failed to start ({type(root).__name__})", False
    status = next((e for e in causes if isinstance(e, httpx2.HTTPStatusError)), None)
    if status is not None:
        code = status.response.status_code
        return f"the server answered HTTP {code}", code >= 500 or code == 429
    if _is_connection_closed(root):
        return "the server closed the connection before initialization completed", True
    if any(isinstance(e, ConnectionRefusedError) for e in causes):
        return "the connection was refused", True
    if any(isinstance(e, OSError | httpx2.TransportError) for e in causes):
        return f"could not connect ({type(root).__name__})", True
    return f"it failed to initialize ({type(root).__name__})", False


def _tool_raising_error_text(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a function tool so any exception becomes the result text ``Error: <message>``.

    FastMCP's own text is ``Error calling tool '<name>': <message>``; turnkeep promises the
    fast-agent spelling. ``functools.wraps`` keeps the signature, annotations and docstring
    FastMCP builds the input schema and description from. A tool calling ``sys.exit()`` gets an
    error result too: in the worker's event loop a ``SystemExit`` would end the whole worker."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except (Exception, SystemExit) as err:
                raise _tool_error(err) from err

        return run_async

    # Stays synchronous so FastMCP still runs it on a worker thread.
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (Exception, SystemExit) as err:
            raise _tool_error(err) from err

    return run


def _tool_error(err: BaseException) -> ToolError:
    if isinstance(err, SystemExit):
        return ToolError(f"Error: the tool called sys.exit({err.code!r})")
    return ToolError(f"Error: {err}")


def import_callable(path: str, base_dir: Path | None = None) -> Callable[..., Any]:
    """Resolve ``"package.module:function"`` (the attribute may be dotted). Modules are found on
    ``sys.path`` and, as with fast-agent's config, beside the config file (``base_dir``)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{path!r} is not of the form 'package.module:function'")
    if base_dir is not None and str(base_dir) not in sys.path:
        sys.path.append(str(base_dir))
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{path!r} is not callable")
    return obj


class _FixedToolsServer(FastMCP):
    """A FastMCP server whose tools are all registered when it is built and never change
    (turnkeep's function-tool servers), so each is looked up once. FastMCP looks a tool up on
    every call through its providers (an anyio task group): 0.6 ms of a function tool's
    2.5 ms activity inside a turn, measured alone."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._found: dict[str, Tool] = {}

    async def get_tool(self, name: str, version: VersionSpec | None = None) -> Tool | None:
        if version is not None:
            return await super().get_tool(name, version)
        tool = self._found.get(name)
        if tool is None:
            tool = await super().get_tool(name)
            if tool is not None:
                self._found[name] = tool
        return tool


def build_function_server(name: str, functions: Sequence[Callable[..., Any]]) -> FastMCP:
    server: FastMCP = _FixedToolsServer(name)
    seen: set[str] = set()
    for fn in functions:
        if not callable(fn):
            raise TypeError(f"function tool {fn!r} is not callable")
        tool_name = getattr(fn, "__name__", None)
        if not tool_name:
            raise ValueError(f"function tool {fn!r} has no __name__")
        if tool_name in seen:
            raise ValueError(f"two function tools are named {tool_name!r}")
        seen.add(tool_name)
        tool = _tool_raising_error_text(fn)
        if _wraps_its_result(tool, tool_name):
            # A plain value (text, a number, a list) is given once, as text. FastMCP would also
            # give it as structured content {"result": ...} under a generated output schema,
            # which doubles every such result in history, in the conversation and in each
            # model call's input, while no model sees it (providers send the content).
            server.tool(tool, name=tool_name, output_schema=None)
        else:
            server.tool(tool, name=tool_name)
    return server


def _wraps_its_result(fn: Callable[..., Any], name: str) -> bool:
    """Whether FastMCP would wrap ``fn``'s result as ``{"result": ...}`` (a non-object
    return type)."""
    schema = Tool.from_function(fn, name=name).output_schema or {}
    return bool(schema.get("x-fastmcp-wrap-result"))


# --- function tools, called in process ---------------------------------------------------------
# A function-tool server lives in this process, so its tools are called on the FastMCP object
# itself rather than through an in-memory MCP session: JSON-RPC over memory streams plus the
# client's result validation made up ~13% of a worker's busy CPU in a quick turn. Measured per
# call on the 2-core dev machine: a sync tool returning 5 KB 4.2 -> 1.4 ms, an async tool
# 2.1 -> 0.5 ms, tools/list 2.5 -> 0.45 ms. The same reason pydantic-ai's durable_exec keeps
# function tools apart from MCP toolsets. What the model sees does not change: results and
# listings are what an MCP client of the server receives (tests/test_function_tools.py
# compares both paths).


@dataclass(frozen=True)
class _FunctionServer:
    mcp: FastMCP
    # Tools with a parameter FastMCP injects (``ctx: Context``, ``Depends(...)``) may read the
    # request's ``_meta`` (the idempotency key) or talk to the client, which takes a real MCP
    # request: they keep going through the pooled in-memory client. (A tool that fetches the
    # context itself with ``get_context()`` is not detected; it runs without a request.)
    session_tools: frozenset[str]
    session: _FunctionSession


async def list_function_tools(server: FastMCP) -> list[mcp.types.Tool]:
    """The tools as an MCP client lists them: mirrors fastmcp's ``_on_list_tools`` on the
    2026-07-28 protocol the in-memory client negotiates (no output-schema rewrite; one page,
    as the server sets no page size)."""
    tools = dedupe_with_versions(list(await server.list_tools()), lambda t: t.name)
    return [t.to_mcp_tool(name=t.name, outputSchema=t.output_schema) for t in tools]


async def call_function_tool(
    server: FastMCP, tool: str, arguments: dict[str, Any]
) -> mcp.types.CallToolResult:
    """Run a function tool in the calling task; an error is returned as an ``isError`` result.

    Cancelling the caller cancels an async tool's coroutine; a sync tool's worker thread runs
    to its end and its result is dropped, as with a cancelled MCP request. Unlike an MCP
    request, no ``_meta`` reaches the tool."""
    try:
        # Without the middleware chain: turnkeep builds this server and adds none, and the one
        # FastMCP adds by default (DereferenceRefsMiddleware) acts on listings only. The chain
        # costs more than an instant tool itself.
        outcome: ToolResult | Exception = await server.call_tool(
            tool, arguments, run_middleware=False
        )
    except Exception as err:
        outcome = err
    return _as_call_tool_result(server, tool, outcome)


def _as_call_tool_result(
    server: FastMCP, tool: str, outcome: ToolResult | Exception
) -> mcp.types.CallToolResult:
    """What an MCP client of ``server`` receives for ``outcome``: mirrors fastmcp 4.2's
    ``MCPOperationsMixin._on_call_tool`` and the SDK runner's ``_stamp_server_info`` on a
    2026-07-28 connection. Input-required and extension results do not arise here: the server
    has neither guard tools nor extensions."""
    if isinstance(outcome, NotFoundError | DisabledError):
        result = _error_result(f"Unknown tool: {tool!r}")
    elif isinstance(outcome, FastMCPError):
        # ToolError (a tool's exception, already ``Error: <message>``), ValidationError (bad
        # arguments), ...
        result = _error_result(str(outcome))
    elif isinstance(outcome, Exception):
        # FastMCP turns whatever a tool raises into a ToolError, so this is FastMCP failing
        # around the tool (over MCP: a JSON-RPC error, which the activity also gives the model
        # as an ``Error: ...`` result instead of failing).
        result = _error_result(f"Error: {outcome}")
    else:
        converted = outcome.to_mcp_result()
        if isinstance(converted, tuple):
            content, structured = converted
            result = mcp.types.CallToolResult(content=content, structured_content=structured)
        elif isinstance(converted, list):
            result = mcp.types.CallToolResult(content=converted)
        else:
            result = converted
    # The SDK runner stamps every 2026-era result; the stamp is kept in the conversation like
    # the rest of ``_meta``, so it stays for results to read as they always did.
    meta = dict(result.meta or {})
    if meta.get(mcp.types.SERVER_INFO_META_KEY) is None:
        meta[mcp.types.SERVER_INFO_META_KEY] = server._mcp_server.server_info_stamp
    return result.model_copy(update={"meta": meta})


def _error_result(text: str) -> mcp.types.CallToolResult:
    return mcp.types.CallToolResult(
        content=[mcp.types.TextContent(type="text", text=text)], is_error=True
    )


# --- the tool sources ---------------------------------------------------------------------------


class McpSource(ToolSource):
    """A server reached over an MCP session: one long-lived ``fastmcp.Client``, opened on first
    use and shared by every concurrent call (MCP multiplexes requests over one session). A
    connection that fails is thrown away so the next call opens a fresh one."""

    def __init__(
        self,
        name: str,
        *,
        init_timeout: float,
        redact: Redactor,
        request_timeout: float | None = None,
    ) -> None:
        self.name = name
        self.redact = redact
        self._init_timeout = init_timeout
        # A tool call unanswered this long fails (fast-agent's `read_timeout_seconds`). Not
        # listings: a server's first answer may be slow on a loaded host, and retries cover it.
        self._request_timeout = request_timeout
        self._client: Client[Any] | None = None
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

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
        return await self._request(
            f"tools/call {tool}",
            lambda c: c.call_tool_mcp(tool, arguments, meta=meta, timeout=self._request_timeout),
        )

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            self._close_soon(client)
        await asyncio.gather(*self._closing)

    # --- the connection ---------------------------------------------------------------------

    async def _request(self, what: str, send: Callable[[Client[Any]], Awaitable[T]]) -> T:
        client = await self._connected()
        try:
            return await send(client)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            if not _is_connection_failure(err):
                raise
            reason = self.redact(_reason(err))
            log.warning(
                "MCP server %r: %s failed, reconnecting next time: %s: %s",
                self.name,
                what,
                type(_root_cause(err)).__name__,
                reason,
            )
            await self._discard(client)
            raise ServerConnectionError(self.name, self.kind, reason) from err

    async def _connected(self) -> Client[Any]:
        client = self._client
        if client is not None and client.is_connected():
            return client
        async with self._lock:
            client = self._client
            if client is not None and client.is_connected():
                return client
            if client is not None:
                await self._discard(client)
            client = await self._open()
            self._client = client
            return client

    async def _discard(self, client: Client[Any]) -> None:
        # Concurrent failures on one connection all land here; only the first closes it, and a
        # connection that another call already replaced is left alone.
        if self._client is client:
            self._client = None
            await asyncio.shield(self._close_soon(client))

    def _close_soon(self, client: Client[Any]) -> asyncio.Task[None]:
        # A task of its own, so a caller cancelled while waiting for the close (a stdio
        # server gets seconds to exit) cannot leave a server process half shut down.
        task = asyncio.create_task(_close_client(client))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task

    async def _open(self) -> Client[Any]:
        client: Client[Any] = Client(
            self._transport(), name=f"turnkeep:{self.name}", init_timeout=self._init_timeout
        )
        try:
            async with asyncio.timeout(self._init_timeout):
                await client.__aenter__()
        except asyncio.CancelledError:
            self._close_soon(client)
            raise
        except Exception as err:
            await asyncio.shield(self._close_soon(client))
            reason, transient = _start_failure(err, self.kind, self._init_timeout)
            # The whole story, for the worker's log only: the failure itself reaches history.
            tail = self._stderr_tail()
            stderr = f"\n--- server stderr (last lines) ---\n{tail}" if tail else ""
            log.warning(
                "MCP server %r (%s) could not be started: %s (%s: %s)%s",
                self.name,
                self.describe(),
                reason,
                type(_root_cause(err)).__name__,
                self.redact(_reason(err)),
                self.redact(stderr),
            )
            raise ServerUnavailable(self.name, self.kind, reason, transient=transient) from err
        log.info("MCP server %r connected (%s)", self.name, self.describe())
        return client


class _ConfiguredSource(McpSource):
    """An ``mcp.servers`` entry's MCP server."""

    def __init__(self, name: str, config: McpServerSettings, settings: Settings) -> None:
        super().__init__(
            name,
            init_timeout=config.init_timeout,
            redact=Redactor.of(config),
            request_timeout=config.read_timeout_seconds,
        )
        self._config = config
        self._settings = settings

    @classmethod
    def from_config(cls, name: str, config: McpServerSettings, settings: Settings) -> ToolSource:
        return cls(name, config, settings)

    def describe(self) -> str:
        cfg = self._config
        where = shlex.join([cfg.command or "", *cfg.args]) if self.kind == "stdio" else cfg.url
        return f"{self.kind}: {self.redact(where or '')}"


class StdioSource(_ConfiguredSource):
    """A server the worker runs as a subprocess, one per worker, talking over its stdio."""

    kind = "stdio"

    def __init__(self, name: str, config: McpServerSettings, settings: Settings) -> None:
        super().__init__(name, config, settings)
        assert config.command is not None  # guaranteed by McpServerSettings
        self._command = config.command
        # One append-only file for the source's lifetime: its tail explains a server that dies
        # while starting, and the history of earlier crashes stays readable.
        self._stderr_dir: tempfile.TemporaryDirectory[str] | None = None
        self._stderr_start = 0

    def _transport(self) -> ClientTransport:
        cfg = self._config
        return StdioTransport(
            self._command,
            list(cfg.args),
            env=dict(cfg.env) if cfg.env else None,
            cwd=str(self._settings.path(cfg.cwd)) if cfg.cwd else None,
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

    def __init__(self, name: str, config: McpServerSettings, settings: Settings) -> None:
        super().__init__(name, config, settings)
        assert config.url is not None  # guaranteed by McpServerSettings
        self._url = config.url

    def _transport(self) -> ClientTransport:
        return StreamableHttpTransport(self._url, headers=self._config.headers)


class SseSource(HttpSource):
    """A server at a URL, over MCP's older SSE transport."""

    kind = "sse"

    def _transport(self) -> ClientTransport:
        return SSETransport(self._url, headers=self._config.headers)


class _FunctionSession(McpSource):
    """A function-tool server over an in-memory MCP session, for its tools that need one."""

    kind = FUNCTION_TOOLS

    def __init__(self, name: str, server: FastMCP) -> None:
        super().__init__(name, init_timeout=_FUNCTION_SERVER_INIT_TIMEOUT, redact=Redactor())
        self._server = server

    def _transport(self) -> ClientTransport:
        return FastMCPTransport(self._server)


class FunctionToolSource(ToolSource):
    """Python functions served by an in-process FastMCP server, built on first use and called
    directly (``call_function_tool``) unless a tool asks for FastMCP's ``Context``. Declared by
    ``function_tools`` (import paths in the settings, functions through the plugin) rather than
    by an ``mcp.servers`` entry."""

    kind = FUNCTION_TOOLS

    def __init__(
        self,
        name: str,
        paths: Sequence[str] = (),
        functions: Sequence[Callable[..., Any]] = (),
        base_dir: Path | None = None,
    ) -> None:
        self.name = name
        self._paths = list(paths)
        self._functions = list(functions)
        self._base_dir = base_dir
        self._built: _FunctionServer | None = None
        # Its tools are fixed when it is built, so it is listed once.
        self._listing: list[mcp.types.Tool] | None = None

    async def list_tools(self) -> list[mcp.types.Tool]:
        if self._listing is None:
            self._listing = await list_function_tools(self._server().mcp)
        return list(self._listing)

    async def call_tool(
        self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> mcp.types.CallToolResult:
        """Raises only ``ServerUnavailable`` (the functions cannot be imported) or
        ``CancelledError``; what a tool raises is its result."""
        functions = self._server()
        if tool in functions.session_tools:
            return await functions.session.call_tool(tool, arguments, meta)
        # In process. ``meta`` is dropped: a plain callable has nowhere to receive it; a tool
        # that wants the idempotency key declares a ``Context`` parameter and is called over
        # MCP above.
        return await call_function_tool(functions.mcp, tool, arguments)

    async def aclose(self) -> None:
        if self._built is not None:
            await self._built.session.aclose()

    def _server(self) -> _FunctionServer:
        built = self._built
        if built is None:
            try:
                functions = [import_callable(p, self._base_dir) for p in self._paths]
                functions += self._functions
                mcp_server = build_function_server(self.name, functions)
                session_tools = frozenset(
                    fn.__name__ for fn in functions if without_injected_parameters(fn) is not fn
                )
            except Exception as err:
                # The owner's own code failing to import: nothing secret, and the reason helps.
                raise ServerUnavailable(
                    self.name, FUNCTION_TOOLS, _reason(err), transient=False
                ) from err
            built = _FunctionServer(
                mcp_server, session_tools, _FunctionSession(self.name, mcp_server)
            )
            self._built = built
        return built


# --- the registry and the pool -----------------------------------------------------------------

ENTRY_POINT_GROUP = "turnkeep.tool_sources"
BUILTIN_TOOL_SOURCES: tuple[type[ToolSource], ...] = (StdioSource, HttpSource, SseSource)


class ToolSourceRegistry:
    """Tool-source classes by kind. A kind another class has is refused, never silently
    taken over."""

    def __init__(self, sources: Iterable[type[ToolSource]] = ()) -> None:
        self._kinds: dict[str, type[ToolSource]] = {}
        for source in sources:
            self.register(source)

    def register(self, source: type[ToolSource]) -> None:
        if not (isinstance(source, type) and issubclass(source, ToolSource)):
            raise TypeError(f"{source!r} is not a ToolSource subclass")
        kind = getattr(source, "kind", "")
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"{source.__name__}.kind must be a non-empty string")
        known_source = self._kinds.get(kind)
        if known_source is source:
            return
        if known_source is not None:
            raise ValueError(
                f"two tool sources are of kind {kind!r}: {known_source.__qualname__} and "
                f"{source.__qualname__}"
            )
        self._kinds[kind] = source

    def with_sources(self, sources: Iterable[type[ToolSource]]) -> ToolSourceRegistry:
        """This registry and ``sources`` (a worker's own), leaving this one unchanged."""
        registry = ToolSourceRegistry(self)
        for source in sources:
            registry.register(source)
        return registry

    def __iter__(self) -> Iterator[type[ToolSource]]:
        return iter(self._kinds.values())

    def build(self, name: str, config: McpServerSettings, settings: Settings) -> ToolSource:
        """Server ``name``'s source: the class of the kind its ``transport`` names."""
        kind = config.transport or "stdio"
        source = self._kinds.get(kind)
        if source is None:
            raise ValueError(
                f"MCP server {name!r} has transport {kind!r}, which no registered tool source "
                f"serves (known: {known(self._kinds)})"
            )
        return source.from_config(name, config, settings)


@functools.cache
def installed_tool_sources() -> ToolSourceRegistry:
    """The built-in kinds and those of installed packages, whose distributions declare
    ``[project.entry-points."turnkeep.tool_sources"] openapi = "mypackage.tools:OpenApi"``.
    Loaded once per process; a broken entry point stops the worker with its name."""
    registry = ToolSourceRegistry(BUILTIN_TOOL_SOURCES)
    register_installed(registry.register, ENTRY_POINT_GROUP, "tool source")
    return registry


class McpPool:
    """A worker's tool sources by server name, for the life of its process: each
    ``mcp.servers`` entry's (built by the registered kind its ``transport`` names) and each
    function-tool server's."""

    def __init__(
        self,
        settings: Settings,
        function_tools: Mapping[str, Sequence[Callable[..., Any]]] | None = None,
        sources: ToolSourceRegistry | None = None,
    ) -> None:
        paths = settings.function_tools
        functions = function_tools or {}
        function_servers = sorted(set(paths) | set(functions))
        clashing = [n for n in settings.mcp.servers if n in function_servers]
        if clashing:
            raise ValueError(f"server name(s) {clashing} are both MCP servers and function tools")
        # Tool names are namespaced `server__tool` and split on the first `__`.
        bad = [n for n in [*settings.mcp.servers, *function_servers] if "__" in n or not n]
        if bad:
            raise ValueError(
                f"server name(s) {sorted(bad)} must be non-empty and must not contain '__'"
            )
        registry = sources or installed_tool_sources()
        self._sources: dict[str, ToolSource] = {
            name: registry.build(name, config, settings)
            for name, config in settings.mcp.servers.items()
        }
        for name in function_servers:
            self._sources[name] = FunctionToolSource(
                name, paths.get(name, ()), functions.get(name, ()), settings.base_dir
            )

    @property
    def servers(self) -> list[str]:
        return sorted(self._sources)

    def source(self, server: str) -> ToolSource:
        try:
            return self._sources[server]
        except KeyError:
            raise UnknownServer(server, self.servers) from None

    async def list_tools(self, server: str) -> list[mcp.types.Tool]:
        return await self.source(server).list_tools()

    async def call_tool(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        meta: dict[str, Any] | None = None,
    ) -> mcp.types.CallToolResult:
        """Call a tool (``ToolSource.call_tool``). An ``isError`` result is returned, not
        raised."""
        return await self.source(server).call_tool(tool, arguments, meta)

    async def aclose(self) -> None:
        """Close every open connection (ending stdio server processes). The pool stays usable:
        a later call opens its server again."""
        await asyncio.gather(*(source.aclose() for source in self._sources.values()))

    async def __aenter__(self) -> McpPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


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
