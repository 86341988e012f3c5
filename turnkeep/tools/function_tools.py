"""Function tools: Python functions served as one server's tools by an in-process FastMCP
server, called on the FastMCP object directly (no MCP session) unless a tool asks for FastMCP's
``Context``. What the model sees is what an MCP client of the server would receive."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp.types
from fastmcp import FastMCP
from fastmcp.client.transports import (
    ClientTransport,
    FastMCPTransport,
)
from fastmcp.exceptions import DisabledError, FastMCPError, NotFoundError, ToolError
from fastmcp.server.dependencies import without_injected_parameters
from fastmcp.tools import Tool, ToolResult
from fastmcp.utilities.versions import VersionSpec, dedupe_with_versions

from turnkeep.config.callables import import_callable
from turnkeep.support.sdk_private import server_info_stamp
from turnkeep.tools.failures import failure_reason
from turnkeep.tools.mcp import McpSource
from turnkeep.tools.redaction import Redactor
from turnkeep.tools.source import (
    ServerUnavailable,
    ToolSource,
)

# Function-tool servers live in this process; they start at once.
_FUNCTION_SERVER_INIT_TIMEOUT = 30.0


FUNCTION_TOOLS = "function tools"


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


class _FixedToolsServer(FastMCP):
    """A FastMCP server whose tools are all registered when it is built and never change
    (turnkeep's function-tool servers), so each is looked up once. FastMCP looks a tool up on
    every call through its providers (an anyio task group), a large share of what a quick
    function tool's activity costs."""

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
    """What an MCP client of ``server`` receives for ``outcome``: mirrors fastmcp's
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
        stamp = server_info_stamp(server)
        if stamp is not None:
            meta[mcp.types.SERVER_INFO_META_KEY] = stamp
    return result.model_copy(update={"meta": meta})


def _error_result(text: str) -> mcp.types.CallToolResult:
    return mcp.types.CallToolResult(
        content=[mcp.types.TextContent(type="text", text=text)], is_error=True
    )


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
                    self.name, FUNCTION_TOOLS, failure_reason(err), transient=False
                ) from err
            built = _FunctionServer(
                mcp_server, session_tools, _FunctionSession(self.name, mcp_server)
            )
            self._built = built
        return built
