"""How the CLI shows a turn in a terminal: one renderer for `run`, `watch` and `show`."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape

from worker.turn_history import ActivityOutcome, ActivityTiming, TurnStatus, TurnView
from workflows.messages import Message, StopReason
from workflows.turn_io import TurnResult

MAX_RESULT_CHARS = 600


def _short(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more chars)"


def _duration(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    return f"{seconds:.2f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def _since(moment: datetime, now: datetime) -> str:
    return _duration((now - moment).total_seconds() * 1000)


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_STATUS_STYLE = {
    TurnStatus.RUNNING: "cyan",
    TurnStatus.COMPLETED: "green",
    TurnStatus.CANCELLED: "yellow",
}


class TurnRenderer:
    def __init__(self, console: Console) -> None:
        self.console = console
        self._tool_names: dict[str, str] = {}  # call id -> tool name, to label results
        # call id -> the tool call's activity, when rendering a turn read from its history
        self._tool_timings: dict[str, ActivityTiming] = {}

    def message(self, message: Message) -> None:
        if message.role == "assistant":
            self._assistant(message)
        elif message.tool_results:
            self._tool_results(message)
        elif message.text:
            self.console.print(f"[bold blue]user ›[/] {escape(message.text)}")

    def _assistant(self, message: Message) -> None:
        if message.text:
            self.console.print(f"[bold green]assistant ›[/] {escape(message.text)}")
        for call_id, call in (message.tool_calls or {}).items():
            self._tool_names[call_id] = call.name
            args = call.invalid_arguments or json.dumps(call.arguments, ensure_ascii=False)
            self.console.print(
                f"  [cyan]→ {escape(call.name)}[/]({escape(args)}) [dim]{call_id}[/]"
            )
        error = (message.channels or {}).get("error")
        if error:
            self.console.print(
                f"  [red]error: {escape(Message(role='user', content=error).text)}[/]"
            )
        if message.stop_reason not in (None, StopReason.TOOL_USE, StopReason.END_TURN):
            self.console.print(f"  [yellow]stop: {message.stop_reason}[/]")

    def _tool_results(self, message: Message) -> None:
        timing = message.channel_json("tool_timing") or {}
        for call_id, result in (message.tool_results or {}).items():
            name = self._tool_names.get(call_id, call_id)
            ms = timing.get(call_id, {}).get("timing_ms")
            took = f" [dim]{_duration(ms)}[/]" if isinstance(ms, int | float) else ""
            if call_id in self._tool_timings:
                took = f" [dim]{_took(self._tool_timings[call_id])}[/]"
            style = "red" if result.is_error else "magenta"
            self.console.print(
                f"  [{style}]← {escape(name)}[/]{took}: {escape(_short(result.text))}"
            )

    def summary(self, result: TurnResult, *, running: bool = False) -> None:
        usage = ", ".join(
            f"{model}: {u.input_tokens} in / {u.output_tokens} out ({u.calls} calls)"
            for model, u in result.usage.items()
        )
        # A running turn has no stop reason yet (its result holds only a default).
        ended = (
            "[bold]still running[/]" if running else f"[bold]stop reason:[/] {result.stop_reason}"
        )
        self.console.print(
            f"{ended} · iterations: {result.iterations}" + (f" · usage: {usage}" if usage else "")
        )
        if result.rollback:
            self.console.print(f"[bold]history repair:[/] {result.rollback}")

    # -- a turn read from its history (`turnkeep show`) ------------------------------------

    def view(self, view: TurnView) -> None:
        """Everything ``turnkeep show`` prints: header, conversation, what is in flight,
        timings, and how the turn ended (or why it could not run)."""
        now = datetime.now(UTC)
        self._tool_timings = {t.call_id: t for t in view.activities if t.call_id is not None}
        self._header(view, now)
        for warning in view.warnings:
            self.console.print(f"[yellow]warning:[/] {escape(warning)}")
        # Before its loop started a turn has only its input to show.
        for message in view.result.messages if view.result is not None else view.prompt:
            self.message(message)
        if view.failure:
            self.console.print(f"[bold red]{view.status}:[/] {escape(view.failure)}")
        for timing in view.in_flight:
            self._in_flight(timing, now)
        self._model_timings(view)
        if view.result is not None:
            self.summary(view.result, running=view.status == TurnStatus.RUNNING)
        elif view.status == TurnStatus.RUNNING:
            self.console.print("[bold]still running:[/] the loop has not started yet")

    def _header(self, view: TurnView, now: datetime) -> None:
        about = " · ".join(
            f"{label} {escape(value)}"
            for label, value in (("agent", view.agent), ("model", view.model))
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
            f"[bold {style}]{view.status}[/] · started {_when(view.started_at)} · {took}{chain}"
        )

    def _in_flight(self, timing: ActivityTiming, now: datetime) -> None:
        if timing.outcome == ActivityOutcome.SCHEDULED:
            # `attempts` is the attempt waiting to start (0 when the server has not said).
            attempt = f"attempt {timing.attempts} " if timing.attempts else ""
            doing = f"{attempt}waiting for a worker"
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
