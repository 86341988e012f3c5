"""Asking the person at the terminal about what a turn waits for (tool calls awaiting approval,
questions, client-side results, a budget), for ``turnkeep run``, ``watch`` and ``chat``.

The command feeds each message it follows to a ``WaitPrompter``. While the turn runs, the
prompter asks it which calls wait for a decision (the ``pending_approvals`` query; a gated call
waits inside the turn, so there is no message to see): often while tool calls are open, at an
idle pace between them, when only a budget can hold the next model call. On a terminal it
asks about each new wait (``turnkeep.cli.wait_question``); the answer goes to the turn as
``turnkeep approve``, ``answer``, ``submit`` or ``budget`` sends it, audited under the local
user name. Without a terminal (a pipe, CI) it asks nothing: it prints one line saying what
waits and the command that decides it (``turnkeep.cli.waits``), and the command keeps
following.

A call decided elsewhere meanwhile (another terminal, the API) is noticed while the prompt
waits, and the prompt is dropped; an answer given in the same instant is refused by the
update's validator, whose reason is shown. Either way the command goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.text import Text
from temporalio.client import WorkflowQueryRejectedError
from temporalio.service import RPCError

from turnkeep.cli.console import console
from turnkeep.cli.line_reader import LineReader, stdin_lines
from turnkeep.cli.render import visible
from turnkeep.cli.wait_question import WaitAsker, call_key
from turnkeep.cli.waits import describe_wait
from turnkeep.client.sessions import SessionHandle
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.approval import PendingCall
from turnkeep.contract.messages import Message

# How often the turn is asked which calls wait: soon after the model asked for tools, then
# less often while a long tool runs (one query a second at most; a question asked looks
# whether its call still waits as often).
_FIRST_POLL = 0.2
MAX_POLL = 1.0
# A query is answered by a worker of the turn's task queue; a busy or absent one must not
# hold the prompt up for the server's default minute.
QUERY_TIMEOUT = timedelta(seconds=10)
# With no tool call open only a budget can wait (before a model call, hours at a time): asked
# less often, and not held up long by a worker that is absent (Ctrl-C waits for the query).
_IDLE_POLL = 2.0
_IDLE_QUERY_TIMEOUT = timedelta(seconds=2)


def local_user() -> str:
    """Who decides from this terminal, as the audit trail records it."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return "unknown"


TurnSource = Callable[[], Awaitable[TurnHandle | None]]


class WaitPrompter:
    """Watches the turn whose messages the command follows for what waits in it for a person
    (a call's approval, a question, a client's result, a budget), and asks about each once.
    Use as an async context manager around the following, and pass it every message
    followed, before printing it (``saw``)."""

    def __init__(
        self,
        turn: TurnSource,
        *,
        interactive: bool | None = None,
        reader: LineReader | None = None,
        out: Console = console,
        by: str | None = None,
    ) -> None:
        self._turn = turn
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self._reader = reader or stdin_lines()
        self._out = out
        self._by = by or local_user()
        self._open: set[str] = set()  # tool calls asked for whose results have not come
        self._handled: set[tuple[str, str]] = set()  # (turn, call) asked or told about
        self._asking: tuple[TurnHandle, PendingCall] | None = None  # the prompt shown
        self._settled = asyncio.Event()  # the call asked about has been answered meanwhile
        self._closing = asyncio.Event()
        self._poke = asyncio.Event()  # tool calls came: look now
        self._task: asyncio.Task[None] | None = None
        # Following a session's turns: "always" may then be for the session.
        self.in_session = False

    @classmethod
    def for_turn(cls, handle: TurnHandle, **kwargs: Any) -> WaitPrompter:
        async def turn() -> TurnHandle:
            return handle

        return cls(turn, **kwargs)

    @classmethod
    def for_session(cls, session: SessionHandle, **kwargs: Any) -> WaitPrompter:
        """For a session's turns: whichever turn is running when a call comes up."""

        async def turn() -> TurnHandle | None:
            running = (await session.progress()).turn
            return get_turn(session.client, running.workflow_id) if running else None

        prompter = cls(turn, **kwargs)
        prompter.in_session = True
        return prompter

    async def __aenter__(self) -> WaitPrompter:
        # From the start: a budget can hold the turn's first model call, before any message.
        self._start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    def saw(self, message: Message) -> None:
        """A message of the turn, as the command follows it, before it prints it."""
        asking = self._asking
        # A child turn's call is answered in the child's messages, not in these.
        own = asking is not None and asking[1].turn_id is None
        if asking and own and asking[1].call_id in (message.tool_results or {}):
            # The call has been answered, so decided elsewhere: drop the prompt, and let the
            # message start on a line of its own rather than after the prompt.
            self._out.print()
            self._settled.set()
        if message.role == "assistant" and message.tool_calls:
            self._open.update(message.tool_calls)
        if message.tool_results:
            self._open.difference_update(message.tool_results)
        if message.tool_calls:
            self._poke.set()  # calls asked for: look at once, not at the idle pace
        self._start()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._watch(), name="turnkeep-approvals")

    async def close(self) -> None:
        """Stop watching (the turn has ended, or the command is leaving); a prompt still
        waiting is dropped."""
        task, self._task = self._task, None
        if task is None:
            return
        # Let the watch end by itself rather than cancel it: a query cancelled in flight makes
        # the worker log a warning, on this terminal when the worker runs in-process. A prompt
        # up is dropped, saying what became of its call (decided elsewhere before the prompt
        # noticed, or the turn was cancelled).
        self._closing.set()
        self._settled.set()
        # Bounded: on time out, wait_for cancels it (an editor left open, a worker gone).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task, QUERY_TIMEOUT.total_seconds() * 2)

    async def _watch(self) -> None:
        """While the turn runs: ask it which calls wait, and deal with each new one. Often
        while tool calls are open (approvals, questions, client results wait on them), at an
        idle pace otherwise (a budget waits before a model call)."""
        delay = _FIRST_POLL
        handle: TurnHandle | None = None
        while not self._closing.is_set():
            await self._pause(delay)
            if self._closing.is_set():
                return
            # The turn is looked up once it runs; what waits does not outlive its turn.
            handle = handle or await self._current_turn()
            new: list[PendingCall] = []
            if handle is not None:
                timeout = QUERY_TIMEOUT if self._open else _IDLE_QUERY_TIMEOUT
                waiting = await _pending(handle, timeout)
                if waiting is None:
                    return  # the turn has ended: nothing more waits
                new = [c for c in waiting if call_key(handle, c) not in self._handled]
            for call in new:
                assert handle is not None
                if self._closing.is_set():
                    return
                self._handled.add(call_key(handle, call))
                if self.interactive:
                    await self._ask(handle, call)
                else:
                    self._tell(handle, call)
            ceiling = MAX_POLL if self._open else _IDLE_POLL
            delay = _FIRST_POLL if new else min(delay * 2, ceiling)

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less: until the prompter closes or tool calls come."""
        if self._poke.is_set():
            self._poke.clear()
            return
        poked = asyncio.ensure_future(self._poke.wait())
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait(
                {poked, closing}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            poked.cancel()
            closing.cancel()
        self._poke.clear()

    async def _ask(self, handle: TurnHandle, call: PendingCall) -> None:
        self._asking = (handle, call)
        self._settled.clear()
        asker = WaitAsker(
            reader=self._reader,
            out=self._out,
            by=self._by,
            settled=self._settled,
            poll=MAX_POLL,
            query_timeout=QUERY_TIMEOUT,
            in_session=self.in_session,
        )
        try:
            answered = await asker.ask(handle, call)
        finally:
            self._asking = None
        if not answered:
            self.interactive = False  # nobody is left to answer: tell about the rest
            self._out.print()
            self._tell(handle, call)

    async def _current_turn(self) -> TurnHandle | None:
        try:
            return await self._turn()
        except RPCError:
            return None  # a worker slow to answer the session's query: next round

    def _tell(self, handle: TurnHandle, call: PendingCall) -> None:
        line = describe_wait(handle.workflow_id, call).line()
        self._out.print(Text(visible(line), style="yellow"), soft_wrap=True)


async def _pending(handle: TurnHandle, rpc_timeout: timedelta) -> list[PendingCall] | None:
    """What waits in the turn (and its child turns); None once the turn has ended (the server
    says so without a worker replaying it)."""
    try:
        return await handle.pending_approvals(rpc_timeout=rpc_timeout, open_only=True)
    except WorkflowQueryRejectedError:
        return None
    except RPCError:
        # No worker answered in time, or the turn has gone: ask again on the next round.
        return []
