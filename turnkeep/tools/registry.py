"""A worker's tool servers: the registry of tool-source kinds (built in, installed, a
worker's own) and ``ToolServers``, which builds one source per server and keeps it for the
life of the worker process."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import mcp.types

from turnkeep.config.settings import McpServerSettings, Settings
from turnkeep.contract.activity_io import TOOL_SEPARATOR
from turnkeep.errors import known
from turnkeep.support.registry import Registry
from turnkeep.tools.function_tools import FunctionToolSource
from turnkeep.tools.mcp import HttpSource, SseSource, StdioSource
from turnkeep.tools.source import (
    ToolSource,
    UnknownServer,
)

log = logging.getLogger(__name__)


ENTRY_POINT_GROUP = "turnkeep.tool_sources"
BUILTIN_TOOL_SOURCES: tuple[type[ToolSource], ...] = (StdioSource, HttpSource, SseSource)


class ToolSourceRegistry(Registry[ToolSource]):
    """Tool-source classes by kind. A kind another class has is refused, never silently
    taken over."""

    base = ToolSource
    key = "kind"
    what = "tool source"
    share = "are of kind"

    def build(self, name: str, config: McpServerSettings, settings: Settings) -> ToolSource:
        """Server ``name``'s source: the class of the kind its ``transport`` names."""
        kind = config.transport or "stdio"
        source = self.get(kind)
        if source is None:
            raise ValueError(
                f"MCP server {name!r} has transport {kind!r}, which no registered tool source "
                f"serves (known: {known(s.kind for s in self)})"
            )
        return source.from_config(name, config, settings)


@functools.cache
def installed_tool_sources() -> ToolSourceRegistry:
    """The built-in kinds and those of installed packages, whose distributions declare
    ``[project.entry-points."turnkeep.tool_sources"] openapi = "mypackage.tools:OpenApi"``.
    Loaded once per process; a broken entry point stops the worker with its name."""
    return ToolSourceRegistry(BUILTIN_TOOL_SOURCES).register_installed(ENTRY_POINT_GROUP)


class ToolServers:
    """A worker's tool sources by server name, for the life of its process: each
    ``mcp.servers`` entry's (built by the registered kind its ``transport`` names) and each
    function-tool server's.

    It is given the whole ``Settings``, and only while it builds the sources: a source's
    ``from_config`` is an extension point documented for third parties, and takes them whole.
    Nothing is kept but the sources."""

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
        names = [*settings.mcp.servers, *function_servers]
        bad = [n for n in names if TOOL_SEPARATOR in n or not n]
        if bad:
            raise ValueError(
                f"server name(s) {sorted(bad)} must be non-empty and must not contain "
                f"{TOOL_SEPARATOR!r}"
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

    async def __aenter__(self) -> ToolServers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
