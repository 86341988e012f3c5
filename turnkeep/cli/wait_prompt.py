"""Asking the person at the terminal about what a turn waits for (tool calls awaiting approval,
questions, client-side results, a budget), for ``turnkeep run``, ``watch`` and ``chat``.

The command feeds each message it follows to a ``WaitPrompter``. While the turn runs, the
prompter asks it which calls wait for a decision (the ``pending_approvals`` query; a gated call
waits inside the turn, so there is no message to see): often while tool calls are open, at an
idle pace between them, when only a budget can hold the next model call. On a terminal it
shows each wait and asks; the answer goes through the ``decide`` update, as ``turnkeep
approve`` sends it, audited under the local user name. Without a terminal (a pipe, CI) it asks
nothing: it prints one line saying what waits and the command that decides it
(``turnkeep.cli.waits``), and the command keeps following.

A call decided elsewhere meanwhile (another terminal, the API) is noticed while the prompt
waits, and the prompt is dropped; an answer given in the same instant is refused by the
update's validator, whose reason is shown. Either way the command goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text
from temporalio.client import WorkflowQueryRejectedError, WorkflowUpdateFailedError
from temporalio.exceptions import FailureError
from temporalio.service import RPCError

from turnkeep.cli.console import console
from turnkeep.cli.line_reader import LineReader, stdin_lines
from turnkeep.cli.render import _visible
from turnkeep.cli.typed_input import field_hint, field_value, in_editor, json_object
from turnkeep.cli.waits import describe_wait
from turnkeep.client.sessions import SessionHandle
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.approval import PendingCall, RememberScope
from turnkeep.contract.messages import Message

PROMPT = "Approve? [y]es / [a]lways / [n]o / [e]dit: "
RESULT_PROMPT = "Result (one line; empty: deny the call): "
JSON_RESULT_PROMPT = "Result as one line of JSON (empty: deny the call): "
ELICIT_PROMPT = "[a]nswer / [d]ecline / [c]ancel: "
BUDGET_PROMPT = "Raise the budget to (a number; empty: stop the turn): "
# How often the turn is asked which calls wait: soon after the model asked for tools, then
# less often while a long tool runs (one query a second at most).
_FIRST_POLL = 0.2
_MAX_POLL = 1.0
# With no tool call open only a budget can wait (before a model call, hours at a time): asked
# less often, and not held up long by a worker that is absent (Ctrl-C waits for the query).
_IDLE_POLL = 2.0
_IDLE_QUERY_TIMEOUT = timedelta(seconds=2)
# A query is answered by a worker of the turn's task queue; a busy or absent one must not
# hold the prompt up for the server's default minute.
_QUERY_TIMEOUT = timedelta(seconds=10)


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
        self._draft: str | None = None  # arguments being edited, not yet a JSON object
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
            await asyncio.wait_for(task, _QUERY_TIMEOUT.total_seconds() * 2)

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
                timeout = _QUERY_TIMEOUT if self._open else _IDLE_QUERY_TIMEOUT
                waiting = await _pending(handle, timeout)
                if waiting is None:
                    return  # the turn has ended: nothing more waits
                new = [c for c in waiting if _key(handle, c) not in self._handled]
            for call in new:
                assert handle is not None
                if self._closing.is_set():
                    return
                self._handled.add(_key(handle, call))
                if self.interactive:
                    await self._ask(handle, call)
                else:
                    self._tell(handle, call)
            ceiling = _MAX_POLL if self._open else _IDLE_POLL
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

    async def _current_turn(self) -> TurnHandle | None:
        try:
            return await self._turn()
        except RPCError:
            return None  # a worker slow to answer the session's query: next round

    def _tell(self, handle: TurnHandle, call: PendingCall) -> None:
        line = describe_wait(handle.workflow_id, call).line()
        self._out.print(Text(_visible(line), style="yellow"), soft_wrap=True)

    async def _ask(self, handle: TurnHandle, call: PendingCall) -> None:
        self._show(call)
        self._asking = (handle, call)
        self._settled.clear()
        self._draft = None
        try:
            if call.kind == "client_result":
                await self._ask_result(handle, call)
                return
            if call.kind == "budget":
                await self._ask_budget(handle, call)
                return
            while call.kind == "elicitation":
                choice = (await self._line(ELICIT_PROMPT, handle, call)).strip().lower()
                if choice in ("a", "answer"):
                    content = await self._form(handle, call)
                    if await self._answer(handle, call, content=content):
                        return
                elif choice in ("d", "decline", "c", "cancel"):
                    cancel = choice.startswith("c")
                    await self._answer(handle, call, decline=not cancel, cancel=cancel)
                    return
                else:
                    self._out.print("answer a, d or c", markup=False)
            while True:
                answer = await self._line(PROMPT, handle, call)
                choice = answer.strip().lower()
                if choice in ("y", "yes"):
                    await self._decide(handle, call, approve=True)
                    return
                if choice in ("a", "always"):
                    scope: RememberScope = "turn"
                    if self.in_session:
                        where = await self._line(
                            "Always for the [t]urn or the [s]ession? ", handle, call
                        )
                        scope = "session" if where.strip().lower() in ("s", "session") else "turn"
                    same = await self._line("Only with these arguments? [y/N]: ", handle, call)
                    await self._decide(
                        handle,
                        call,
                        approve=True,
                        remember=scope,
                        remember_arguments=same.strip().lower() in ("y", "yes"),
                    )
                    return
                if choice in ("n", "no"):
                    reason = await self._line("Reason (optional): ", handle, call)
                    await self._decide(handle, call, approve=False, reason=reason.strip())
                    return
                if choice in ("e", "edit"):
                    edited = await self._edit(handle, call)
                    if edited is None:
                        continue  # kept as they were: ask again
                    await self._decide(handle, call, approve=True, arguments=edited)
                    return
                self._out.print("answer y, a, n or e", markup=False)
        except _NoLongerWaiting:
            became = await _what_became_of(handle, call)
            self._out.print()
            self._out.print(f"[yellow]{escape(became)}[/]")
        except _EndOfInput:
            self.interactive = False  # nobody is left to answer: tell about the rest
            self._out.print()
            self._tell(handle, call)
        finally:
            self._asking = None

    async def _ask_result(self, handle: TurnHandle, call: PendingCall) -> None:
        """Ask for a client-side call's result: a line of text, or of JSON when its tool has
        an output schema; asked again while the turn refuses it. An empty line denies it."""
        schema = call.requested_schema
        if schema is not None:
            self._out.print(Text(_visible("output schema: " + json.dumps(schema))))
        while True:
            line = await self._line(JSON_RESULT_PROMPT if schema else RESULT_PROMPT, handle, call)
            if not line.strip():
                reason = await self._line("Reason (optional): ", handle, call)
                await self._decide(handle, call, approve=False, reason=reason.strip())
                return
            result: str | dict[str, Any] = line
            if schema is not None:
                try:
                    result = json_object(line, "the result")
                except ValueError as err:
                    self._out.print(f"[red]{escape(str(err))}[/]")
                    continue
            try:
                await _owner(handle, call).submit_tool_result(call.call_id, result, by=self._by)
            except WorkflowUpdateFailedError as err:
                cause = err.cause
                why = cause.message if isinstance(cause, FailureError) else str(cause)
                self._out.print(f"[yellow]not submitted: {escape(why)}[/]")
                if "does not match" in why or "structured content" in why:
                    continue  # the call still waits: ask again
                return
            except RPCError as err:
                self._out.print(f"[yellow]not submitted: {escape(err.message)}[/]")
                return
            self._out.print(f"submitted the result of call {escape(call.call_id)}")
            return

    async def _ask_budget(self, handle: TurnHandle, call: PendingCall) -> None:
        """A budget's wait: a new budget to raise it to, or nothing to stop the turn."""
        while True:
            answer = await self._line(BUDGET_PROMPT, handle, call)
            text = answer.strip().lower()
            if text in ("", "n", "no", "stop"):
                await self._decide(handle, call, approve=False)
                return
            try:
                limit = float(text)
            except ValueError:
                self._out.print(
                    "answer a number (the new budget), or nothing to stop", markup=False
                )
                continue
            if await self._decide(handle, call, approve=True, limit=limit):
                return

    async def _form(self, handle: TurnHandle, call: PendingCall) -> dict[str, Any]:
        """The requested schema as a form: one typed prompt per property (MCP's requested
        schemas are flat); an empty line leaves an optional field out."""
        schema = call.requested_schema or {}
        required = set(schema.get("required") or [])
        content: dict[str, Any] = {}
        for name, spec in (schema.get("properties") or {}).items():
            spec = spec if isinstance(spec, dict) else {}
            while True:
                hint = field_hint(spec, optional=name not in required)
                text = (await self._line(f"{name} ({hint}): ", handle, call)).strip()
                if not text and name not in required:
                    break
                try:
                    content[name] = field_value(spec, text)
                    break
                except ValueError as err:
                    self._out.print(f"[red]{escape(str(err))}[/]")
        return content

    async def _answer(
        self,
        handle: TurnHandle,
        call: PendingCall,
        *,
        content: dict[str, Any] | None = None,
        decline: bool = False,
        cancel: bool = False,
    ) -> bool:
        """Send the answer; False when the turn refused it (asked again)."""
        try:
            record = await _owner(handle, call).answer_elicitation(
                call.call_id, content, decline=decline, cancel=cancel, by=self._by
            )
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            why = cause.message if isinstance(cause, FailureError) else str(cause)
            self._out.print(f"[yellow]not answered: {escape(why)}[/]")
            return not await _still_waits(handle, call)
        except RPCError as err:
            self._out.print(f"[yellow]not answered: {escape(err.message)}[/]")
            return True
        verb = "answered" if record.approved else ("cancelled" if cancel else "declined")
        self._out.print(f"{verb} {escape(record.call_id)}")
        return True

    def _show(self, call: PendingCall) -> None:
        if call.kind == "budget":
            self._out.print()
            self._out.print(
                Text.assemble(
                    ("budget reached", "bold yellow"),
                    " · ",
                    _visible(call.prompt or ""),
                    _visible(_in_child(call)),
                )
            )
            return
        if call.kind not in ("approval", "client_result"):
            self._out.print()
            self._out.print(
                Text.assemble(
                    (f"{call.kind} requested", "bold yellow"),
                    " · ",
                    (_visible(call.name), "cyan"),
                    " · ",
                    (_visible(call.call_id), "dim"),
                    _visible(_in_child(call)),
                )
            )
            self._out.print(Text(_visible(call.prompt or "")))
            return
        needed = "result needed" if call.kind == "client_result" else "approval needed"
        self._out.print()
        self._out.print(
            Text.assemble(
                (needed, "bold yellow"),
                " · ",
                (_visible(call.name), "cyan"),
                " · call ",
                (_visible(call.call_id), "dim"),
                _visible(_in_child(call)),
            )
        )
        arguments = json.dumps(call.arguments, indent=2, ensure_ascii=False)
        self._out.print(Text(_visible(arguments)))

    async def _line(self, prompt: str, handle: TurnHandle, call: PendingCall) -> str:
        """The line typed after ``prompt``, without its newline. Raises ``_NoLongerWaiting``
        once the call no longer waits (decided elsewhere), ``_EndOfInput`` at end of input."""
        self._out.print(prompt, end="", markup=False)
        read = asyncio.ensure_future(self._reader.readline())
        settled = asyncio.ensure_future(self._settled.wait())
        try:
            while True:
                await asyncio.wait(
                    {read, settled}, timeout=_MAX_POLL, return_when=asyncio.FIRST_COMPLETED
                )
                if read.done():
                    break
                # Between reads, not beside them: a query cancelled in flight would make the
                # worker log a warning.
                if settled.done() or not await _still_waits(handle, call):
                    raise _NoLongerWaiting
        finally:
            read.cancel()  # the reader keeps a line being read for the next prompt
            settled.cancel()
        line = read.result()
        if not line:
            raise _EndOfInput
        return line.rstrip("\r\n")

    async def _edit(self, handle: TurnHandle, call: PendingCall) -> dict[str, Any] | None:
        """Arguments to run the call with: from ``$VISUAL``/``$EDITOR`` when one is set, else
        one line of JSON, asked again until it is a JSON object. None: keep them as they are
        (and ask again whether to approve)."""
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        original = json.dumps(call.arguments, indent=2, ensure_ascii=False)
        if editor:
            # After a draft that was not a JSON object, `e` again reopens that draft.
            text = await asyncio.to_thread(in_editor, editor, self._draft or original)
            if text is None:
                self._out.print(f"[red]the editor {escape(editor)} failed[/]")
                return None
            try:
                return json_object(text)
            except ValueError as err:
                self._draft = text
                self._out.print(f"[red]{escape(str(err))} (e edits it again)[/]")
                return None
        while True:
            text = await self._line(
                "Arguments as one line of JSON (empty: keep them): ", handle, call
            )
            if not text.strip():
                return None
            try:
                return json_object(text)
            except ValueError as err:
                self._out.print(f"[red]{escape(str(err))}[/]")

    async def _decide(
        self,
        handle: TurnHandle,
        call: PendingCall,
        *,
        approve: bool,
        reason: str | None = None,
        arguments: dict[str, Any] | None = None,
        limit: float | None = None,
        remember: RememberScope | None = None,
        remember_arguments: bool = False,
    ) -> bool:
        """Whether the decision was taken (a refusal is printed)."""
        if arguments == call.arguments:
            arguments = None  # not an edit
        try:
            record = await _owner(handle, call).decide(
                call.call_id,
                approve,
                reason=reason or None,
                by=self._by,
                arguments=arguments,
                limit=limit,
                remember=remember,
                remember_arguments=remember_arguments,
            )
        except WorkflowUpdateFailedError as err:
            # Decided elsewhere in the same instant, or the turn ended: the validator says so.
            cause = err.cause
            why = cause.message if isinstance(cause, FailureError) else str(cause)
            self._out.print(f"[yellow]not decided: {escape(why)}[/]")
            return False
        except RPCError as err:  # the turn has gone, the server is unreachable
            self._out.print(f"[yellow]not decided: {escape(err.message)}[/]")
            return False
        if record.kind == "budget":
            verb = f"raised the budget to {limit:g}" if record.approved else "stopped at the budget"
            self._out.print(verb)
            return True
        edit = " with edited arguments" if record.arguments is not None else ""
        verb = "approved" if record.approved else "denied"
        self._out.print(f"{verb} call {escape(record.call_id)}{edit}")
        if record.rule is not None:
            self._out.print(
                f"{escape(record.tool)} is allowed for the rest of the {record.remember} "
                f"(rule {escape(record.rule)})"
            )
        return True


class _EndOfInput(Exception):
    """stdin has ended: no one can answer a prompt."""


class _NoLongerWaiting(Exception):
    """The call being asked about has been decided elsewhere."""


def _key(handle: TurnHandle, call: PendingCall) -> tuple[str, str]:
    """A waiting call, by the turn it is of and its id (a child turn's call ids may be its
    parent's too)."""
    return (call.turn_id or handle.workflow_id, call.call_id)


def _owner(handle: TurnHandle, call: PendingCall) -> TurnHandle:
    """The turn ``call`` waits in: the one followed, or one of its child turns."""
    return get_turn(handle.client, call.turn_id) if call.turn_id else handle


def _in_child(call: PendingCall) -> str:
    if call.turn_id is None:
        return ""
    return f" · agent {call.agent or '?'} (turn {call.turn_id})"


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


async def _still_waits(handle: TurnHandle, call: PendingCall) -> bool:
    try:
        waiting = await handle.pending_approvals(rpc_timeout=_QUERY_TIMEOUT)
    except RPCError:
        return True  # a busy worker is no sign of a decision
    return any(_key(handle, c) == _key(handle, call) for c in waiting)


async def _what_became_of(handle: TurnHandle, call: PendingCall) -> str:
    """Why ``call`` no longer waits, as the turn records it (best effort: a line to show)."""
    said = f"call {call.call_id} no longer waits for approval"
    try:
        current = await asyncio.wait_for(
            _owner(handle, call).current(), _QUERY_TIMEOUT.total_seconds()
        )
    except (RPCError, TimeoutError):
        return said
    for record in current.decisions if current else []:
        if record.call_id != call.call_id:
            continue
        if record.decision == "timeout":
            return f"call {call.call_id} was denied: no decision came in time"
        verb = "approved" if record.approved else "denied"
        return f"call {call.call_id} was {verb} elsewhere, by {_visible(record.by)}"
    return said
