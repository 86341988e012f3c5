"""How the CLI shows a turn in a terminal: one renderer for `run`, `watch` and `show`.

Everything a turn carries (texts, tool arguments and results, channels) comes from clients and
models, so it is printed as plain text, never as markup: long texts are cut with their size
(``--full`` prints them whole), control characters are shown escaped rather than sent to the
terminal, and a channel that does not hold what turnkeep writes there is ignored.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text
from temporalio.client import WorkflowExecutionStatus

from turnkeep.client.children import ChildEnded, ChildStarted, ChildText, ChildTurn, TurnEvent
from turnkeep.client.history import ActivityOutcome, ActivityTiming, TurnView
from turnkeep.client.live import MessageEvent, Restarted, TextDelta
from turnkeep.client.status import TurnStatus
from turnkeep.contract.approval import DecisionRecord
from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.turn_io import TurnResult, Usage
from turnkeep.workflows.visibility import format_usd

MAX_RESULT_CHARS = 600  # a tool result: its gist
MAX_TEXT_CHARS = 4000  # a message's text, a tool call's arguments
# C0 and C1 control characters but newline and tab: escape sequences could move the cursor,
# clear the screen or retitle the operator's terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plural(count: int, word: str) -> str:
    """``1 call``, ``2 calls``: a count with its noun (a regular one)."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


_STATUS_WORDS = {
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TIMED_OUT: "timed out",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued as new",
}


def status_word(status: WorkflowExecutionStatus | None) -> str:
    """A workflow's status as the CLI says it: ``completed``, ``cancelled``, ``timed out``..."""
    if status is None:
        return "closed"
    return _STATUS_WORDS.get(status, status.name.lower())


def _short(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more chars)"


def visible(text: str) -> str:
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def _tool_ms(timing: Any, call_id: str) -> float | None:
    """A tool call's time from a ``tool_timing`` channel's value, if it holds one."""
    entry = timing.get(call_id) if isinstance(timing, dict) else None
    ms = entry.get("timing_ms") if isinstance(entry, dict) else None
    if isinstance(ms, bool) or not isinstance(ms, int | float) or not math.isfinite(ms):
        return None
    return ms if ms >= 0 else None


def _duration(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    return f"{seconds:.2f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def _since(moment: datetime, now: datetime) -> str:
    return _duration((now - moment).total_seconds() * 1000)


def utc_time(moment: datetime) -> str:
    """A moment as the CLI prints it: in UTC, saying so."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_STATUS_STYLE = {
    TurnStatus.RUNNING: "cyan",
    TurnStatus.COMPLETED: "green",
    TurnStatus.CANCELLED: "yellow",
}


class TurnRenderer:
    def __init__(self, console: Console, *, full: bool = False) -> None:
        self.console = console
        self.full = full  # print long texts whole instead of cut
        self._tool_names: dict[str, str] = {}  # call id -> tool name, to label results
        # call id -> the tool call's activity, when rendering a turn read from its history
        self._tool_timings: dict[str, ActivityTiming] = {}
        # The live text printed of the model call in progress (``live``), so its completed
        # message does not print it again.
        self._live_text = ""
        # The child turn whose live text the current line holds, if one does.
        self._child_line: str | None = None
        # call id -> the child turns that answered it, when rendering a turn's history
        self._children: dict[str, list[ChildTurn]] = {}

    def live(self, event: TurnEvent) -> None:
        """An event of ``TurnHandle.stream()`` (or ``stream_with_children()``): live text is
        printed as it comes, on one line that the completed message then ends; a child turn's
        start and end on a line each, and its live text on a line of its own."""
        if isinstance(event, ChildText):
            self._child_text(event)
            return
        self._end_child_line()
        if isinstance(event, ChildStarted | ChildEnded):
            if self._live_text:  # ends the turn's own live line, which a child does not share
                self.console.print()
                self._live_text = ""
            self.child(event.child, started=isinstance(event, ChildStarted))
        elif isinstance(event, MessageEvent):
            self.message(event.message)
        elif isinstance(event, TextDelta):
            if not self._live_text:
                self.console.print(Text("assistant › ", "bold green"), end="")
            self._live_text += event.text
            self.console.print(Text(visible(event.text)), end="", soft_wrap=True)
        elif isinstance(event, Restarted):
            if self._live_text:
                self.console.print()
            self._live_text = ""
            self._line((f"[model call restarted: attempt {event.attempt}]", "yellow"))

    def _child_text(self, event: ChildText) -> None:
        if self._child_line != event.workflow_id:
            self._end_child_line()
            if self._live_text:
                self.console.print()
                self._live_text = ""
            self.console.print(Text(f"    {visible(event.agent or '?')} › ", "green"), end="")
            self._child_line = event.workflow_id
        self.console.print(Text(visible(event.text)), end="", soft_wrap=True)

    def _end_child_line(self) -> None:
        if self._child_line is not None:
            self.console.print()
            self._child_line = None

    def child(self, child: ChildTurn, *, started: bool = False) -> None:
        """A child turn on one line: which agent, for which step or call, how it stands (or
        that it has just started), and its id, to show or watch it by."""
        if child.call_id is not None:
            where = f"call {child.call_id}"
        elif child.step is not None:
            where = f"step {child.step}"
        else:
            where = "child turn"
        parts = [visible(child.agent or "?"), visible(where)]
        if started:
            parts.append("started")
        else:
            parts.append(str(child.status).replace("_", " "))
            if child.took_ms is not None:
                parts.append(_duration(child.took_ms))
            elif child.status == TurnStatus.RUNNING:
                parts.append(f"for {_since(child.started_at, datetime.now(UTC))}")
            if child.stop_reason not in (None, StopReason.END_TURN, StopReason.TOOL_USE):
                parts.append(f"stop: {child.stop_reason}")
        parts.append(f"turn {visible(child.workflow_id)}")
        if child.usage:
            parts.append(f"usage: {usage_text(child.usage)}")
        style = "red" if child.status in _FAILED else "dim"
        self._line(("  ↳ ", "cyan"), (" · ".join(parts), style))
        if child.failure:
            self._line(("    error: ", "red"), (self._content(child.failure, 200), "red"))

    def message(self, message: Message) -> None:
        if message.role == "assistant":
            self._assistant(message)
        elif message.tool_results:
            self._tool_results(message)
        elif message.text:
            self._line(("user ›", "bold blue"), " ", self._content(message.text))

    def _assistant(self, message: Message) -> None:
        live, self._live_text = self._live_text, ""
        if live:
            self.console.print()  # ends the live line
        if message.text and message.text != live:
            # Not (all) seen live: the message, as history has it.
            self._line(("assistant ›", "bold green"), " ", self._content(message.text))
        for call_id, call in (message.tool_calls or {}).items():
            self._tool_names[call_id] = call.name
            args = call.invalid_arguments or json.dumps(call.arguments, ensure_ascii=False)
            self._line(
                ("  → ", "cyan"),
                (visible(call.name), "cyan"),
                "(",
                self._content(args),
                ") ",
                (visible(call_id), "dim"),
            )
            for child in self._children.pop(call_id, []):
                self.child(child)
        error = (message.channels or {}).get("error")
        if error:
            text = Message(role="user", content=error).text
            self._line(("  error: ", "red"), (self._content(text), "red"))
        if message.stop_reason not in (None, StopReason.TOOL_USE, StopReason.END_TURN):
            self.console.print(f"  [yellow]stop: {message.stop_reason}[/]")

    def _tool_results(self, message: Message) -> None:
        try:
            timing = message.channel_json("tool_timing")
        except ValueError:
            timing = None  # not JSON: a client's, not what the loop records
        for call_id, result in (message.tool_results or {}).items():
            name = self._tool_names.get(call_id, call_id)
            ms = _tool_ms(timing, call_id)
            took = f" {_duration(ms)}" if ms is not None else ""
            if call_id in self._tool_timings:
                took = f" {_took(self._tool_timings[call_id])}"
            style = "red" if result.is_error else "magenta"
            self._line(
                ("  ← ", style),
                (visible(name), style),
                (took, "dim"),
                ": ",
                self._content(result.text, MAX_RESULT_CHARS),
            )

    def _content(self, text: str, limit: int = MAX_TEXT_CHARS) -> str:
        """A text from the turn as it may be printed: cut to ``limit`` with its size, unless
        ``full``, and with control characters escaped."""
        if self.full or len(text) <= limit:
            return visible(text)
        return visible(text[:limit]) + (
            f"… [cut: {len(text):,} chars in all; `turnkeep show --full` prints them whole]"
        )

    def _line(self, *parts: str | tuple[str, str]) -> None:
        # Text, not markup: the turn's content is printed as it is, and a multi-megabyte text
        # (with --full) prints in a fraction of a second instead of being parsed for markup.
        self.console.print(Text.assemble(*parts), soft_wrap=True)

    def summary(self, result: TurnResult, *, running: bool = False) -> None:
        usage = usage_text(result.usage)
        # A running turn has no stop reason yet (its result holds only a default).
        ended = (
            "[bold]still running[/]" if running else f"[bold]stop reason:[/] {result.stop_reason}"
        )
        self.console.print(
            f"{ended} · iterations: {result.iterations}" + (f" · usage: {usage}" if usage else "")
        )
        if result.rollback:
            self.console.print(f"[bold]history repair:[/] {result.rollback}")
        for d in result.decisions:
            self._line(("decision: ", "bold"), visible(decision_line(d)))

    # -- a turn read from its history (`turnkeep show`) ------------------------------------

    def view(self, view: TurnView) -> None:
        """Everything ``turnkeep show`` prints: header, conversation, what is in flight,
        timings, and how the turn ended (or why it could not run)."""
        now = datetime.now(UTC)
        self._tool_timings = {t.call_id: t for t in view.activities if t.call_id is not None}
        self._children = {}
        steps = []  # a team's steps, shown before its answer
        for child in view.children:
            if child.call_id is None:
                steps.append(child)
            else:
                self._children.setdefault(child.call_id, []).append(child)
        self._header(view, now)
        for warning in view.warnings:
            self.console.print(f"[yellow]warning:[/] {escape(warning)}")
        # Before its loop started a turn has only its input to show.
        for message in view.result.messages if view.result is not None else view.prompt:
            if message.role == "assistant" and steps:
                for child in steps:
                    self.child(child)
                steps = []
            self.message(message)
        # A team still at its steps; and any child whose call the conversation lacks.
        for child in [*steps, *(c for cs in self._children.values() for c in cs)]:
            self.child(child)
        self._children = {}
        if view.failure:
            self.console.print(f"[bold red]{view.status}:[/] {escape(view.failure)}")
        for timing in view.in_flight:
            self._in_flight(timing, now)
        if view.waiting_for_capacity:
            self.console.print(f"[bold yellow]{escape(view.waiting_for_capacity)}[/]")
        self._model_timings(view)
        if view.result is not None:
            self.summary(view.result, running=view.status == TurnStatus.RUNNING)
        elif view.status == TurnStatus.RUNNING:
            self.console.print("[bold]still running:[/] the loop has not started yet")

    def _header(self, view: TurnView, now: datetime) -> None:
        about = " · ".join(
            f"{label} {escape(value)}"
            for label, value in (
                ("agent", view.agent),
                ("model", view.model),
                ("priority", view.priority),
                ("tenant", view.tenant),
            )
            if value
        )
        self.console.print(
            f"[bold]turn[/] {escape(view.workflow_id)}" + (f" · {about}" if about else "")
        )
        style = _STATUS_STYLE.get(view.status, "red")
        if view.closed_at is not None:
            took = f"took {_since(view.started_at, view.closed_at)}"
        else:
            took = f"running for {_since(view.started_at, now)}"
        runs = len(view.runs)
        chain = f" · {runs} runs (continued as new)" if runs > 1 else ""
        self.console.print(
            f"[bold {style}]{view.status}[/] · started {utc_time(view.started_at)} · {took}{chain}"
        )

    def _in_flight(self, timing: ActivityTiming, now: datetime) -> None:
        if timing.outcome == ActivityOutcome.SCHEDULED:
            # `attempts` is the attempt waiting to start (0 when the server has not said).
            attempt = f"attempt {timing.attempts} " if timing.attempts else ""
            doing = f"{attempt}waiting for a worker"
            if timing.local:  # its own worker retries it once its backoff timer fires
                doing = f"attempt {timing.attempts} failed, waiting to retry"
        else:
            started = timing.started_at or timing.scheduled_at
            doing = f"attempt {max(timing.attempts, 1)} running for {_since(started, now)}"
        line = f"[bold cyan]in flight:[/] {escape(timing.label)} · {doing}"
        line += f" · scheduled {_since(timing.scheduled_at, now)} ago"
        if timing.failure:
            line += f" · last failure: {escape(_short(timing.failure, 200))}"
        self.console.print(line)

    def _model_timings(self, view: TurnView) -> None:
        calls = [t for t in view.activities if t.call_index is not None and t.total_ms is not None]
        if not calls:
            return
        total = sum(t.total_ms or 0 for t in calls)
        each = " · ".join(f"#{t.call_index} {_took(t)}" for t in calls)
        self.console.print(
            f"[bold]model calls:[/] {len(calls)} in {_duration(total)} [dim]({each})[/]"
        )


# What each kind of wait's call is called, and the words for its decisions.
_DECIDED = {
    "approval": ("call", "approved", "denied"),
    "sampling": ("sampling request", "approved", "denied"),
    "elicitation": ("question", "answered", "declined"),
    "client_result": ("client-side call", "submitted the result of", "refused"),
}


def decision_line(d: DecisionRecord) -> str:
    """One decision of the turn's audit trail, as a person reads it: what became of which
    call (or of the budget), who decided and when, and why."""
    when = f"by {d.by} at {utc_time(d.at)}"
    if d.decision == "timeout":
        when = f"nobody decided in time ({utc_time(d.at)})"
    reason = f": {d.reason}" if d.reason else ""
    if d.kind == "budget":
        if d.approved:
            before = (d.original_arguments or {}).get("limit")
            after = (d.arguments or {}).get("limit")
            return f"raised the budget from {_number(before)} to {_number(after)} · {when}{reason}"
        return f"stopped at the budget · {when}{reason}"
    thing, yes, no = _DECIDED.get(d.kind, ("call", "approved", "denied"))
    verb = yes if d.approved else no
    line = f"{verb} {thing} {d.call_id} ({d.tool}) · {when}{reason}"
    if d.arguments is not None:
        line += f" · with edited arguments {json.dumps(d.arguments, ensure_ascii=False)}"
    if d.rule is not None and d.remember is not None:
        line += f" · allowed for the rest of the {d.remember} (rule {d.rule})"
    return line


def _number(value: Any) -> str:
    return f"{value:,.10g}" if isinstance(value, int | float) else "?"


_FAILED = (TurnStatus.FAILED, TurnStatus.TERMINATED, TurnStatus.TIMED_OUT)


def usage_text(usage: dict[str, Usage]) -> str:
    """A turn's usage per model, with the total cost when there are several models."""
    text = ", ".join(
        f"{model}: {u.input_tokens} in / {u.output_tokens} out ({plural(u.calls, 'call')}, "
        f"{format_usd(u.cost_usd)})"
        for model, u in usage.items()
    )
    if len(usage) > 1:
        total = sum(usage.values(), Usage())
        text += f" · cost: {format_usd(total.cost_usd)}"
    return text


def _took(timing: ActivityTiming) -> str:
    """How long an activity took as the history records it, and how it ended if not well."""
    if timing.total_ms is None:
        return str(timing.outcome)
    text = _duration(timing.total_ms)
    if timing.attempts > 1:
        text += f", {timing.attempts} attempts"
    if timing.outcome != ActivityOutcome.COMPLETED:
        text = f"{timing.outcome} after {text}"
    return text
