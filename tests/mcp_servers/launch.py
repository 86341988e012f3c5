"""Start the test MCP server as a subprocess (for HTTP tests) and know where its script is."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

STDIO_SCRIPT: Path = Path(__file__).with_name("test_tools_server.py")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _accepts_mcp(url: str) -> bool:
    try:
        async with Client(StreamableHttpTransport(url), init_timeout=2) as client:
            await client.list_tools()
            return True
    except Exception:
        return False


@contextlib.asynccontextmanager
async def http_server(
    port: int | None = None,
    *,
    env: dict[str, str] | None = None,
    startup_timeout: float = 30.0,
    script: Path = STDIO_SCRIPT,
) -> AsyncIterator[str]:
    """Serve the test tools (or another test server's, ``script``, which takes ``--http
    PORT``) over streamable HTTP on 127.0.0.1; yields the MCP URL.

    Pass ``port`` to restart a server on the address a previous one had."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with tempfile.TemporaryFile() as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            "--http",
            str(port),
            env={**os.environ, **(env or {})},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            deadline = asyncio.get_running_loop().time() + startup_timeout
            while not await _accepts_mcp(url):
                if proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
                    stderr.seek(0)
                    tail = stderr.read()[-2000:].decode(errors="replace")
                    raise RuntimeError(f"test MCP server on port {port} did not start:\n{tail}")
                await asyncio.sleep(0.1)
            yield url
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
