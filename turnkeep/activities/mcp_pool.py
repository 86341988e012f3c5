"""MCP connections pooled per worker process.

One long-lived ``fastmcp.Client`` per configured server, opened on first use and shared by every
concurrent call (MCP multiplexes requests over one session). A connection that fails is thrown
away so the next call opens a fresh one; a tool that merely reports an error is not a failure.
Failures name a server by its config name and transport only: they reach the workflow history,
the model and the CLI. How it is started (command, URL) and what it wrote to stderr go to the
worker's log, with its secrets redacted (``Redactor``).
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
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
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


class ServerUnavailable(Exception):
    """An MCP server could not be started or did not complete initialization.

    ``transient``: trying again may help (a refused connection, no answer in time), unlike a
    command that cannot run or a server that exits while starting."""

    def __init__(self, server: str, transport: str, reason: str, *, transient: bool) -> None:
        self.server = server
        self.reason = reason
        self.transient = transient
        super().__init__(f"MCP server {server!r} ({transport}) could not be started: {reason}")


class ServerConnectionError(Exception):
    """An open MCP connection failed mid-request (process died, HTTP dropped, session closed).

    The pooled connection has been discarded; retrying opens a new one. Whether the tool ran is
    unknown."""

    def __init__(self, server: str, transport: str, reason: str) -> None:
        self.server = server
        self.reason = reason
        super().__init__(f"connection to MCP server {server!r} ({transport}) failed: {reason}")


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


class UnknownServer(KeyError):
    def __init__(self, server: str, known: Sequence[str]) -> None:
        self.server = server
        super().__init__(
            f"no MCP server named {server!r} in this worker's configuration "
            f"(known: {', '.join(sorted(known)) or 'none'})"
        )

    def __str__(self) -> str:
        # KeyError would repr() the message, quotes and all.
        return str(self.args[0])


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


class McpPool:
    """Lazily opened, shared MCP clients, one per server, for the life of a worker process."""

    def __init__(
        self,
        settings: Settings,
        function_tools: Mapping[str, Sequence[Callable[..., Any]]] | None = None,
    ) -> None:
        self._settings = settings
        self._mcp_servers: dict[str, McpServerSettings] = dict(settings.mcp.servers)
        self._function_paths: dict[str, list[str]] = {
            name: list(paths) for name, paths in settings.function_tools.items()
        }
        self._function_callables: dict[str, list[Callable[..., Any]]] = {
            name: list(fns) for name, fns in (function_tools or {}).items()
        }
        names = self.servers
        clashing = [n for n in self._mcp_servers if n in self._function_server_names()]
        if clashing:
            raise ValueError(f"server name(s) {clashing} are both MCP servers and function tools")
        # Tool names are namespaced `server__tool` and split on the first `__`.
        bad = [n for n in names if "__" in n or not n]
        if bad:
            raise ValueError(f"server name(s) {bad} must be non-empty and must not contain '__'")

        self._redactors = {name: Redactor.of(cfg) for name, cfg in self._mcp_servers.items()}
        self._clients: dict[str, Client[Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {name: asyncio.Lock() for name in names}
        self._function_servers: dict[str, _FunctionServer] = {}
        # A function server's tools are fixed when it is built, so it is listed once.
        self._function_listings: dict[str, list[mcp.types.Tool]] = {}
        self._stderr_dir: tempfile.TemporaryDirectory[str] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def _function_server_names(self) -> set[str]:
        return set(self._function_paths) | set(self._function_callables)

    @property
    def servers(self) -> list[str]:
        return sorted(set(self._mcp_servers) | self._function_server_names())

    def transport(self, server: str) -> str:
        """How a server is reached, in a word (``stdio``, ``http``...): all a failure says."""
        if server in self._mcp_servers:
            return self._mcp_servers[server].transport or "stdio"
        if server in self._function_server_names():
            return FUNCTION_TOOLS
        raise UnknownServer(server, self.servers)

    def describe(self, server: str) -> str:
        """How a server is reached, for the worker's log, secrets redacted:
        ``stdio: python weather.py --token ***``."""
        cfg = self._mcp_servers.get(server)
        if cfg is None:
            return self.transport(server)
        if cfg.transport == "stdio":
            where = shlex.join([cfg.command or "", *cfg.args])
        else:
            where = cfg.url or ""
        return f"{cfg.transport}: {self.redact(server, where)}"

    def redact(self, server: str, text: str) -> str:
        """``text`` without ``server``'s secrets (see ``Redactor``)."""
        return self._redactors.get(server, Redactor())(text)

    # --- public API -----------------------------------------------------------------------

    async def list_tools(self, server: str) -> list[mcp.types.Tool]:
        if server in self._function_server_names():
            listing = self._function_listings.get(server)
            if listing is None:
                listing = await list_function_tools(self._function_server(server).mcp)
                self._function_listings[server] = listing
            return list(listing)
        try:
            return await self._request(server, "tools/list", lambda c: c.list_tools())
        except ServerConnectionError:
            # Listing is idempotent, so one immediate retry on a fresh connection is safe; it
            # spares a stale pooled connection (server restarted since) from failing a turn.
            return await self._request(server, "tools/list", lambda c: c.list_tools())

    async def call_tool(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        meta: dict[str, Any] | None = None,
    ) -> mcp.types.CallToolResult:
        """Call a tool. An ``isError`` result is returned, not raised.

        Raises ``ServerUnavailable`` (cannot open), ``ServerConnectionError`` (connection lost;
        not retried here because the tool may already have run), ``MCPError`` (the server
        answered with a JSON-RPC error) or ``CancelledError`` (the MCP client has sent the
        server a cancel notification; the connection stays usable). A function tool is called
        in process (``call_function_tool``): only ``ServerUnavailable`` or ``CancelledError``."""
        if server in self._function_server_names():
            functions = self._function_server(server)
            if tool not in functions.session_tools:
                # In process. ``meta`` is dropped: a plain callable has nowhere to receive it;
                # a tool that wants the idempotency key declares a ``Context`` parameter and is
                # called over MCP below.
                return await call_function_tool(functions.mcp, tool, arguments)
        return await self._request(
            server,
            f"tools/call {tool}",
            lambda c: c.call_tool_mcp(tool, arguments, meta=meta),
        )

    async def aclose(self) -> None:
        """Close every open connection (ending stdio server processes). The pool stays usable:
        a later call opens its server again."""
        clients, self._clients = self._clients, {}
        for client in clients.values():
            self._close_soon(client)
        await asyncio.gather(*self._closing)
        if self._stderr_dir is not None:
            self._stderr_dir.cleanup()
            self._stderr_dir = None

    async def __aenter__(self) -> McpPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- connections ----------------------------------------------------------------------

    async def _request(
        self, server: str, what: str, send: Callable[[Client[Any]], Awaitable[T]]
    ) -> T:
        client = await self._client(server)
        try:
            return await send(client)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            if not _is_connection_failure(err):
                raise
            reason = self.redact(server, _reason(err))
            log.warning(
                "MCP server %r: %s failed, reconnecting next time: %s: %s",
                server,
                what,
                type(_root_cause(err)).__name__,
                reason,
            )
            await self._discard(server, client)
            raise ServerConnectionError(server, self.transport(server), reason) from err

    async def _client(self, server: str) -> Client[Any]:
        lock = self._locks.get(server)
        if lock is None:
            raise UnknownServer(server, self.servers)
        client = self._clients.get(server)
        if client is not None and client.is_connected():
            return client
        async with lock:
            client = self._clients.get(server)
            if client is not None and client.is_connected():
                return client
            if client is not None:
                await self._discard(server, client)
            client = await self._open(server)
            self._clients[server] = client
            return client

    async def _discard(self, server: str, client: Client[Any]) -> None:
        # Concurrent failures on one connection all land here; only the first closes it, and a
        # connection that another call already replaced is left alone.
        if self._clients.get(server) is client:
            del self._clients[server]
            await asyncio.shield(self._close_soon(client))

    def _close_soon(self, client: Client[Any]) -> asyncio.Task[None]:
        # A task of its own, so a caller cancelled while waiting for the close (a stdio
        # server gets seconds to exit) cannot leave a server process half shut down.
        task = asyncio.create_task(_close_client(client))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task

    async def _open(self, server: str) -> Client[Any]:
        stderr_log: Path | None = None
        stderr_start = 0
        if server in self._mcp_servers:
            cfg = self._mcp_servers[server]
            init_timeout = cfg.init_timeout
            if cfg.transport == "stdio":
                stderr_log = self._stderr_file(server)
                stderr_start = stderr_log.stat().st_size
            transport = self._transport(cfg, stderr_log)
        else:
            init_timeout = _FUNCTION_SERVER_INIT_TIMEOUT
            transport = FastMCPTransport(self._function_server(server).mcp)

        client: Client[Any] = Client(
            transport, name=f"turnkeep:{server}", init_timeout=init_timeout
        )
        try:
            async with asyncio.timeout(init_timeout):
                await client.__aenter__()
        except asyncio.CancelledError:
            self._close_soon(client)
            raise
        except Exception as err:
            await asyncio.shield(self._close_soon(client))
            transport_name = self.transport(server)
            reason, transient = _start_failure(err, transport_name, init_timeout)
            # The whole story, for the worker's log only: the failure itself reaches history.
            tail = _read_tail(stderr_log, stderr_start) if stderr_log else ""
            stderr = f"\n--- server stderr (last lines) ---\n{tail}" if tail else ""
            log.warning(
                "MCP server %r (%s) could not be started: %s (%s: %s)%s",
                server,
                self.describe(server),
                reason,
                type(_root_cause(err)).__name__,
                self.redact(server, _reason(err)),
                self.redact(server, stderr),
            )
            raise ServerUnavailable(server, transport_name, reason, transient=transient) from err
        log.info("MCP server %r connected (%s)", server, self.describe(server))
        return client

    def _transport(self, cfg: McpServerSettings, stderr_log: Path | None) -> ClientTransport:
        if cfg.transport == "stdio":
            assert cfg.command is not None  # guaranteed by McpServerSettings
            return StdioTransport(
                cfg.command,
                list(cfg.args),
                env=dict(cfg.env) if cfg.env else None,
                cwd=str(self._settings.path(cfg.cwd)) if cfg.cwd else None,
                # The pool owns the lifetime: closing the client must end the process.
                keep_alive=False,
                log_file=stderr_log,
            )
        assert cfg.url is not None
        if cfg.transport == "sse":
            return SSETransport(cfg.url, headers=cfg.headers)
        return StreamableHttpTransport(cfg.url, headers=cfg.headers)

    def _function_server(self, server: str) -> _FunctionServer:
        built = self._function_servers.get(server)
        if built is None:
            try:
                functions = [
                    import_callable(p, self._settings.base_dir)
                    for p in self._function_paths.get(server, [])
                ]
                functions += self._function_callables.get(server, [])
                mcp_server = build_function_server(server, functions)
                session_tools = frozenset(
                    fn.__name__ for fn in functions if without_injected_parameters(fn) is not fn
                )
                built = _FunctionServer(mcp_server, session_tools)
            except Exception as err:
                # The owner's own code failing to import: nothing secret, and the reason helps.
                raise ServerUnavailable(
                    server, FUNCTION_TOOLS, _reason(err), transient=False
                ) from err
            self._function_servers[server] = built
        return built

    def _stderr_file(self, server: str) -> Path:
        # One append-only file per server for the pool's lifetime: its tail explains a server
        # that dies while starting, and the history of earlier crashes stays readable.
        if self._stderr_dir is None:
            self._stderr_dir = tempfile.TemporaryDirectory(prefix="turnkeep-mcp-")
        path = Path(self._stderr_dir.name) / f"{server}.stderr.log"
        path.touch()
        return path


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
