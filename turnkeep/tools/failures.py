"""Why an MCP request or connection failed, in words that quote neither a server's command nor
its URL: what reaches the workflow history, the model and the CLI names a server by its config
name and transport only."""

from __future__ import annotations

import httpx2
import mcp.types
from mcp.shared.exceptions import MCPError


def is_connection_failure(err: BaseException) -> bool:
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


def root_cause(err: BaseException) -> BaseException:
    # fastmcp wraps transport errors ("Client failed to connect: ..."); the root reads better.
    return _causes(err)[-1]


def _is_connection_closed(err: BaseException) -> bool:
    return isinstance(err, MCPError) and err.code == mcp.types.CONNECTION_CLOSED


def failure_reason(err: BaseException) -> str:
    root = root_cause(err)
    if _is_connection_closed(root):
        return "the connection was closed"
    return str(root).strip() or type(root).__name__


def start_failure(err: BaseException, transport: str, init_timeout: float) -> tuple[str, bool]:
    """Why a server did not start, in words that quote neither its command nor its URL, and
    whether trying again may help: a network failure or a timeout may pass; a command that
    cannot run, a server that exits while starting, or an HTTP 4xx will not."""
    root = root_cause(err)
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
