"""Tool sources: one class per kind of tool server, serving one server's tools to the
``list_tools`` and ``call_tool`` activities.

A ``mcp.servers`` entry's ``transport`` names its kind. The built-in kinds (``stdio``, ``http``,
``sse``: MCP servers) register the same way a third
party's does (the plugin's ``tool_sources=`` or the ``turnkeep.tool_sources`` entry-point
group), so a new kind (OpenAPI, gRPC...) is one class. Function tools (``function_tools:``) are
a source too, declared by functions rather than by a server entry. The worker builds one
instance per server (``from_config``) and keeps it for its life.

What a source raises reaches the workflow history, the model and the CLI, so it names the
server and its kind only: ``ServerUnavailable`` (cannot start; retried only if ``transient``),
``ServerConnectionError`` (lost mid-request; retried), ``mcp``'s ``MCPError`` (the server
refused the request: an error result the model reads). Anything else is a bug, which
Temporal's retry policy handles with its message in history: keep secrets out of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import mcp.types

from turnkeep.config.settings import McpServerSettings, Settings


class ToolSource(ABC):
    # The `transport` a server entry names to be served by this class; failures name it too.
    kind: ClassVar[str]

    @classmethod
    def from_config(cls, name: str, config: McpServerSettings, settings: Settings) -> ToolSource:
        """The worker's one instance for server ``name``, built when the worker is: it must not
        connect (the first ``list_tools`` or ``call_tool`` does), and a ``ValueError`` (a bad
        entry) stops the worker from starting."""
        del name, config, settings
        return cls()

    @abstractmethod
    async def list_tools(self) -> list[mcp.types.Tool]: ...

    @abstractmethod
    async def call_tool(
        self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> mcp.types.CallToolResult:
        """Call ``tool``; a tool that fails is an ``isError`` result, not an exception.
        ``meta`` is the request's ``_meta`` (the idempotency key, the same for every attempt
        of one model tool call): a tool with side effects can de-duplicate retries with it."""

    async def aclose(self) -> None:
        """Release connections or processes (at worker shutdown). The source stays usable: a
        later call opens them again. The default holds none."""
        return None


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
