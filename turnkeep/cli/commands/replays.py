"""``turnkeep replay``: a finished turn's loop run again on another model, agent or system
prompt, its tools answered from the turn's record, and the two set side by side
(``turnkeep.client.replays``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from temporalio.client import Client

from turnkeep.cli.commands import evals
from turnkeep.cli.console import console, print_json
from turnkeep.cli.options import Address, ConfigPath, InProcessWorker, Namespace
from turnkeep.cli.process import ready_to_start, runs_worker, warn_if_unpolled
from turnkeep.cli.target import Target
from turnkeep.client.replays import ReplayReport, ReplaySide, replay_turn, source_input
from turnkeep.contract.turn_io import TurnOverrides, agent_task_queue
from turnkeep.devserver.embedded import ServerInfo

app = typer.Typer()


@app.command()
def replay(
    turn_id: Annotated[
        str | None, typer.Argument(metavar="TURN", help="The finished turn's id.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model to replay on (one the agent allows).")
    ] = None,
    agent: Annotated[
        str | None, typer.Option(help="Agent to replay as (default: the turn's own).")
    ] = None,
    instruction: Annotated[
        Path | None,
        typer.Option(
            help="A file whose text replaces the agent's system prompt (an agent that lists "
            "`instruction` in its `overrides`).",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    live_tools: Annotated[
        bool,
        typer.Option(
            "--live-tools",
            help="Run for real the tool calls no recorded call matches (an agent with "
            "`replay_live_tools: true`); without it they get an error result.",
        ),
    ] = False,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: InProcessWorker = None,
    workflow_id: Annotated[str | None, typer.Option("--id", help="The replay's id.")] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the report (ReplayReport) as JSON.")
    ] = False,
    query: evals.Query = None,
    judge: evals.Judge = None,
    limit: evals.Limit = 100,
    concurrency: evals.Concurrency = 4,
    report_file: evals.ReportFile = None,
    fresh: evals.Fresh = False,
) -> None:
    """Replay a finished turn on another model or prompt without running its tools again:
    each tool call that matches one the turn made (name and arguments) gets its recorded
    result; the report sets the two side by side. With --query instead of a TURN, replay every
    completed turn a visibility query matches, as one durable evaluation: each pair compared,
    scored by the --judge, in a table and a --report (JSON or CSV)."""
    if agent is not None and instruction is not None:
        raise typer.BadParameter("give --agent or --instruction, not both", param_hint="--agent")
    target = Target.of(address, namespace, config)
    if evals.asked(turn_id, query, live_tools=live_tools, judge=judge, report=report_file):
        evals.run_evaluation(
            target,
            query=query or "",
            judge=judge,
            model=model,
            agent=agent,
            instruction=instruction.read_text(encoding="utf-8") if instruction else None,
            limit=limit,
            concurrency=concurrency,
            report_file=report_file,
            workflow_id=workflow_id,
            fresh=fresh,
            json_out=json_out,
            worker=worker,
        )
        return
    assert turn_id is not None  # `asked` refuses neither form
    settings = target.settings
    if json_out:
        console.to_stderr()
    prompt = instruction.read_text(encoding="utf-8") if instruction is not None else None
    in_process = runs_worker(address, worker)

    async def go(client: Client, embedded: ServerInfo | None) -> ReplayReport:
        name = agent or (await source_input(client, turn_id)).agent
        ready_to_start(settings, name, TurnOverrides(model=model), in_process=in_process)
        task_queue = agent_task_queue(settings.task_queue, name)
        handle = await replay_turn(
            client,
            turn_id,
            model=model,
            agent=agent,
            instruction=prompt,
            live_tools=live_tools,
            workflow_id=workflow_id,
            task_queue=task_queue,
        )
        console.print(f"[bold]replay[/] {handle.workflow_id} of {escape(turn_id)}")
        link = embedded.workflow_url(handle.workflow_id) if embedded else None
        if link:
            console.print(f"[bold]Web UI[/] {link}")
        if in_process:
            return await handle.report()
        unpolled = asyncio.ensure_future(warn_if_unpolled(client, task_queue))
        try:
            return await handle.report()
        finally:
            unpolled.cancel()

    report = target.run_with_worker(go, worker=worker)
    if json_out:
        print_json(report.model_dump_json(indent=2))
        return
    print_report(report)


def print_report(report: ReplayReport) -> None:
    """The two turns side by side, then their tool calls: same, new, missing."""
    source, replay = report.source, report.replay
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    table.add_column(f"source {escape(source.workflow_id)}", overflow="fold")
    table.add_column(f"replay {escape(replay.workflow_id)}", overflow="fold")
    for label, show in _ROWS:
        table.add_row(label, escape(show(source)), escape(show(replay)))
    console.print(table)
    for title, calls in (
        ("same", report.same_calls),
        ("new", report.new_calls),
        ("missing", report.missing_calls),
    ):
        console.print(f"[bold]{title} tool calls[/] ({len(calls)})")
        for call in calls:
            console.print(f"  {escape(call.name)} {escape(_args(call.arguments))}")
            if calls is report.new_calls and call.result is not None:
                # Whether it ran live or got the error a call with no recorded result gets.
                console.print(f"    → {escape(_clipped(call.result))}")


def _args(arguments: dict[str, object]) -> str:
    return _clipped(json.dumps(arguments, ensure_ascii=False, sort_keys=True))


def _clipped(text: str, limit: int = 120) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _cost(side: ReplaySide) -> str:
    return "unknown" if side.cost_usd is None else f"${side.cost_usd:.6f}"


def _ms(side: ReplaySide) -> str:
    return "-" if side.duration_ms is None else f"{side.duration_ms / 1000:.2f} s"


_ROWS: tuple[tuple[str, Callable[[ReplaySide], str]], ...] = (
    ("agent", lambda s: s.agent or "-"),
    ("model", lambda s: ", ".join(s.models) or "-"),
    ("final answer", lambda s: s.final or "-"),
    ("stop reason", lambda s: s.stop_reason),
    ("iterations", lambda s: str(s.iterations)),
    ("tool calls", lambda s: str(len(s.tool_calls))),
    ("tokens (in / out)", lambda s: f"{s.tokens} ({s.input_tokens} / {s.output_tokens})"),
    ("cost", _cost),
    ("time", _ms),
)
