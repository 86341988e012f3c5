"""Lines typed at the terminal, read without holding the event loop or the process up: one
reader of stdin for a whole command, shared by ``chat``'s prompt and every prompt about a wait
(``turnkeep.cli.wait_prompt``)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from typing import TextIO


class LineReader:
    """Lines typed on a stream (stdin), read in a daemon thread, one read at a time.

    A read that is given up (a prompt dropped, Ctrl-C) is not lost: the next ``readline``
    takes its line, so a later prompt never races an orphaned thread for what the person
    types. Daemon threads, unlike ``asyncio.to_thread``'s, do not hold the process up at exit
    while they wait for a line that never comes."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._pending: asyncio.Future[str] | None = None

    async def readline(self) -> str:
        """The next line, with its newline; "" at end of input."""
        loop = asyncio.get_running_loop()
        if self._pending is None or self._pending.get_loop() is not loop:
            future: asyncio.Future[str] = loop.create_future()
            threading.Thread(
                target=self._read, args=(loop, future), daemon=True, name="turnkeep-stdin"
            ).start()
            self._pending = future
        pending = self._pending
        # Shielded: a cancelled reader leaves the read going for the next one.
        line = await asyncio.shield(pending)
        if self._pending is pending:
            self._pending = None
        return line

    def _read(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[str]) -> None:
        try:
            line = self._stream.readline()
        except (OSError, ValueError):  # closed stdin
            line = ""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(_settle, future, line)


def _settle(future: asyncio.Future[str], line: str) -> None:
    if not future.done():
        future.set_result(line)


_stdin: LineReader | None = None


def stdin_lines() -> LineReader:
    """The process's one reader of stdin, shared by every prompt of a command."""
    global _stdin
    if _stdin is None:
        _stdin = LineReader(sys.stdin)
    return _stdin
