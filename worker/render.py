"""How the CLI shows a turn in a terminal: one renderer for `run`, `watch` and `show`."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape

from workflows.messages import Message, StopReason
from workflows.turn_io import TurnResult

MAX_RESULT_CHARS = 600


def _short(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more chars)"


class TurnRenderer:
    def __init__(self, console: Console) -> None:
        self.console = console
        self._tool_names: dict[str, str] = {}  # call id -> tool name, to label results

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
            took = f" [dim]{ms:.0f} ms[/]" if isinstance(ms, int | float) else ""
            style = "red" if result.is_error else "magenta"
            self.console.print(
                f"  [{style}]← {escape(name)}[/]{took}: {escape(_short(result.text))}"
            )

    def summary(self, result: TurnResult) -> None:
        usage = ", ".join(
            f"{model}: {u.input_tokens} in / {u.output_tokens} out ({u.calls} calls)"
            for model, u in result.usage.items()
        )
        self.console.print(
            f"[bold]stop reason:[/] {result.stop_reason} · iterations: {result.iterations}"
            + (f" · usage: {usage}" if usage else "")
        )
        if result.rollback:
            self.console.print(f"[bold]history repair:[/] {result.rollback}")
