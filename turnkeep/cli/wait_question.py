"""Asking the person at the terminal about one call that waits in a turn, by its kind: a
call's approval (or a sampling request's), an MCP server's question, a client-side call's
result, a budget. The answer goes to the turn (``decide``, ``answer_elicitation``,
``submit_tool_result``) under the local user's name; a refusal is shown, and the question asked
again when the answer can be mended. A call decided elsewhere meanwhile drops the question
(``settled``, or the turn no longer lists it), saying what became of it.

``turnkeep.cli.wait_prompt`` finds what waits and hands each call to a ``WaitAsker``."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import FailureError
from temporalio.service import RPCError

from turnkeep.cli.line_reader import LineReader
from turnkeep.cli.render import visible
from turnkeep.cli.typed_input import field_hint, field_value, in_editor, json_object
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.approval import PendingCall, RememberScope

PROMPT = "Approve? [y]es / [a]lways / [n]o / [e]dit: "
RESULT_PROMPT = "Result (one line; empty: deny the call): "
JSON_RESULT_PROMPT = "Result as one line of JSON (empty: deny the call): "
ELICIT_PROMPT = "[a]nswer / [d]ecline / [c]ancel: "
BUDGET_PROMPT = "Raise the budget to (a number; empty: stop the turn): "


class WaitAsker:
    """Asks about one waiting call at a time (``ask``), reading the answers from ``reader``
    and showing the questions on ``out``; ``settled`` is set when the call asked about has
    been answered meanwhile (the prompter sees its result come), and every ``poll`` seconds
    it asks the turn whether the call still waits, each query given ``query_timeout`` (the
    prompter's pace). ``in_session``: "always" may then be for the session."""

    def __init__(
        self,
        *,
        reader: LineReader,
        out: Console,
        by: str,
        settled: asyncio.Event,
        poll: float,
        query_timeout: timedelta,
        in_session: bool = False,
    ) -> None:
        self._reader = reader
        self._out = out
        self._by = by
        self._settled = settled
        self._poll = poll
        self._query_timeout = query_timeout
        self.in_session = in_session
        self._draft: str | None = None  # arguments being edited, not yet a JSON object

    async def ask(self, handle: TurnHandle, call: PendingCall) -> bool:
        """Show ``call`` (waiting in ``handle``'s turn, or a child turn of it) and ask about it
        until it is settled: answered here, or decided elsewhere (which is said). False at end
        of input: nobody is left to answer."""
        self._show(call)
        self._draft = None
        dialogs = {
            "client_result": self._ask_result,
            "budget": self._ask_budget,
            "elicitation": self._ask_elicitation,
        }
        try:
            await dialogs.get(call.kind, self._ask_approval)(handle, call)
        except _NoLongerWaiting:
            became = await _what_became_of(handle, call, self._query_timeout)
            self._out.print()
            self._out.print(f"[yellow]{escape(became)}[/]")
        except _EndOfInput:
            return False
        return True

    async def _ask_approval(self, handle: TurnHandle, call: PendingCall) -> None:
        """A call's approval (or a sampling request's): yes, always (for the turn or the
        session, with these arguments or any), no with a reason, or edited arguments."""
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

    async def _ask_elicitation(self, handle: TurnHandle, call: PendingCall) -> None:
        """An MCP server's question: answered with a form from its requested schema (asked
        again while the turn refuses the answer), declined or cancelled."""
        while True:
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

    async def _ask_result(self, handle: TurnHandle, call: PendingCall) -> None:
        """Ask for a client-side call's result: a line of text, or of JSON when its tool has
        an output schema; asked again while the turn refuses it. An empty line denies it."""
        schema = call.requested_schema
        if schema is not None:
            self._out.print(Text(visible("output schema: " + json.dumps(schema))))
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
            return not await _still_waits(handle, call, self._query_timeout)
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
                    visible(call.prompt or ""),
                    visible(_in_child(call)),
                )
            )
            return
        if call.kind not in ("approval", "client_result"):
            self._out.print()
            self._out.print(
                Text.assemble(
                    (f"{call.kind} requested", "bold yellow"),
                    " · ",
                    (visible(call.name), "cyan"),
                    " · ",
                    (visible(call.call_id), "dim"),
                    visible(_in_child(call)),
                )
            )
            self._out.print(Text(visible(call.prompt or "")))
            return
        needed = "result needed" if call.kind == "client_result" else "approval needed"
        self._out.print()
        self._out.print(
            Text.assemble(
                (needed, "bold yellow"),
                " · ",
                (visible(call.name), "cyan"),
                " · call ",
                (visible(call.call_id), "dim"),
                visible(_in_child(call)),
            )
        )
        arguments = json.dumps(call.arguments, indent=2, ensure_ascii=False)
        self._out.print(Text(visible(arguments)))

    async def _line(self, prompt: str, handle: TurnHandle, call: PendingCall) -> str:
        """The line typed after ``prompt``, without its newline. Raises ``_NoLongerWaiting``
        once the call no longer waits (decided elsewhere), ``_EndOfInput`` at end of input."""
        self._out.print(prompt, end="", markup=False)
        read = asyncio.ensure_future(self._reader.readline())
        settled = asyncio.ensure_future(self._settled.wait())
        try:
            while True:
                await asyncio.wait(
                    {read, settled}, timeout=self._poll, return_when=asyncio.FIRST_COMPLETED
                )
                if read.done():
                    break
                # Between reads, not beside them: a query cancelled in flight would make the
                # worker log a warning.
                if settled.done() or not await _still_waits(handle, call, self._query_timeout):
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


def call_key(handle: TurnHandle, call: PendingCall) -> tuple[str, str]:
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


async def _still_waits(handle: TurnHandle, call: PendingCall, query_timeout: timedelta) -> bool:
    try:
        waiting = await handle.pending_approvals(rpc_timeout=query_timeout)
    except RPCError:
        return True  # a busy worker is no sign of a decision
    return any(call_key(handle, c) == call_key(handle, call) for c in waiting)


async def _what_became_of(handle: TurnHandle, call: PendingCall, query_timeout: timedelta) -> str:
    """Why ``call`` no longer waits, as the turn records it (best effort: a line to show)."""
    said = f"call {call.call_id} no longer waits for approval"
    try:
        current = await asyncio.wait_for(
            _owner(handle, call).current(), query_timeout.total_seconds()
        )
    except (RPCError, TimeoutError):
        return said
    for record in current.decisions if current else []:
        if record.call_id != call.call_id:
            continue
        if record.decision == "timeout":
            return f"call {call.call_id} was denied: no decision came in time"
        verb = "approved" if record.approved else "denied"
        return f"call {call.call_id} was {verb} elsewhere, by {visible(record.by)}"
    return said
