"""``turnkeep replay --query``: an evaluation from history (``turnkeep.evaluate``). The options
and the command's body live here; the ``replay`` command takes them beside its TURN form."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from temporalio.client import Client

from turnkeep.cli.console import console, print_json
from turnkeep.cli.render import plural
from turnkeep.cli.target import Target
from turnkeep.client.evaluations import (
    EvaluationHandle,
    evaluation_input,
    start_evaluation,
    write_report,
)
from turnkeep.contract.evaluation_io import MAX_CONCURRENCY, MAX_EVALUATION_TURNS, EvaluationReport
from turnkeep.devserver.embedded import ServerInfo

Query = Annotated[
    str | None,
    typer.Option(
        help="Replay the completed turns a Temporal visibility query matches "
        "(`TurnkeepAgent = 'support'`; '' for all), newest first, instead of one TURN.",
    ),
]
Judge = Annotated[
    str | None,
    typer.Option(
        help="Score each pair: an agent of the worker's config, or a "
        "`package.module:function` its `judges` list.",
    ),
]
Limit = Annotated[
    int,
    typer.Option(help=f"With --query: at most this many turns (at most {MAX_EVALUATION_TURNS})."),
]
Concurrency = Annotated[
    int, typer.Option(help=f"With --query: replays at once (at most {MAX_CONCURRENCY}).")
]
ReportFile = Annotated[
    Path | None,
    typer.Option(
        "--report", help="With --query: write the report there, CSV for a .csv file, else JSON."
    ),
]
Fresh = Annotated[
    bool,
    typer.Option(
        help="With --query: evaluate again even if this same evaluation already completed "
        "(by default running the command again attaches to it).",
    ),
]


def asked(
    turn_id: str | None,
    query: str | None,
    *,
    live_tools: bool,
    judge: str | None,
    report: Path | None,
) -> bool:
    """Whether ``replay`` was asked for an evaluation (``--query``) rather than one TURN;
    ``typer.BadParameter`` for options that go with the other form, or for neither form."""
    if query is None:
        if turn_id is None:
            raise typer.BadParameter("give the TURN to replay, or --query", param_hint="TURN")
        for given, name in ((judge, "--judge"), (report, "--report")):
            if given is not None:
                raise typer.BadParameter(f"{name} goes with --query", param_hint=name)
        return False
    if turn_id is not None:
        raise typer.BadParameter("give a TURN or --query, not both", param_hint="--query")
    if live_tools:
        raise typer.BadParameter(
            "an evaluation never runs tools live: --live-tools is for one TURN",
            param_hint="--live-tools",
        )
    return True


# How often the running evaluation's progress is read while the command waits.
_PROGRESS_EVERY = 2.0


def run_evaluation(
    target: Target,
    *,
    report_file: Path | None,
    workflow_id: str | None,
    fresh: bool,
    json_out: bool,
    worker: bool | None,
    **fields: Any,
) -> None:
    """Start (or attach to) the evaluation that ``fields`` (``EvaluationInput``'s) ask for,
    follow it, print its table and write its report. A request out of bounds is refused
    before anything connects. ``worker``: ``--worker``, as for ``replay TURN``."""
    request = evaluation_input(**fields)
    if json_out:
        console.to_stderr()

    async def go(client: Client, _: ServerInfo | None) -> EvaluationReport:
        handle = await start_evaluation(
            client,
            request,
            workflow_id=workflow_id,
            task_queue=target.settings.task_queue,
            fresh=fresh,
        )
        console.print(f"evaluation {escape(handle.workflow_id)} (run the command again to attach)")
        return await _followed(handle)

    report = target.run_with_worker(go, worker=worker)
    if report_file is not None:
        write_report(report, report_file)
    if json_out:
        print_json(report.model_dump_json(indent=2))
        return
    print_report(report)
    if report_file is not None:
        console.print(f"report written to {escape(str(report_file))}")


async def _followed(handle: EvaluationHandle) -> EvaluationReport:
    """The report, once done, with a line of progress whenever more turns are done."""
    result = asyncio.ensure_future(handle.report())
    said = -1
    try:
        while not result.done():
            await asyncio.wait([result], timeout=_PROGRESS_EVERY)
            if result.done():
                break
            progress = await handle.progress()
            if progress.summary.done != said and progress.summary.turns:
                said = progress.summary.done
                console.print(f"{said}/{progress.summary.turns} turns replayed")
        return await result
    finally:
        result.cancel()


def print_report(report: EvaluationReport) -> None:
    """The evaluation as a table, one line per turn, and its totals."""
    table = Table(box=None, pad_edge=False)
    for column in ("turn", "replay", "same final", "calls =/+/-", "iterations", "tokens", "score"):
        table.add_column(column)
    for row in report.rows:
        if row.status == "failed":
            table.add_row(row.source, "failed", escape(row.error or ""), "", "", "", "")
            continue
        score = "" if row.score is None else f"{row.score:.2f}"
        if row.judge_error is not None:
            score = f"judge failed: {escape(row.judge_error)}"
        table.add_row(
            escape(row.source),
            escape(row.replay.rsplit("/", 1)[-1]),
            "yes" if row.same_final else "no",
            f"{row.same_calls}/{row.new_calls}/{row.missing_calls}",
            f"{row.source_iterations} → {row.replay_iterations}",
            f"{row.source_tokens:,} → {row.replay_tokens:,}",
            score,
        )
    console.print(table)
    s = report.summary
    line = (
        f"{plural(s.turns, 'turn')}: {s.replayed} replayed, {s.failed} failed, "
        f"{s.same_final} with the same final answer"
    )
    if s.skipped:
        line += f" ({s.skipped} matched but left out: replays, other workers' agents)"
    console.print(line)
    if s.mean_score is not None:
        console.print(f"mean score {s.mean_score:.2f} over {plural(s.scored, 'scored pair')}")
    if s.judge_errors:
        console.print(f"the judge failed on {plural(s.judge_errors, 'pair')}")
    cost = ""
    if s.source_cost_usd is not None and s.replay_cost_usd is not None:
        cost = f", ${s.source_cost_usd:.4f} → ${s.replay_cost_usd:.4f}"
    console.print(f"tokens {s.source_tokens:,} → {s.replay_tokens:,}{cost}")
