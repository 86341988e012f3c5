"""The commands about one turn: ``run`` starts one and streams it, ``watch`` streams one
started elsewhere, ``show`` prints one from its history, ``cancel`` cancels one."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated

import typer
from rich.markup import escape

from turnkeep.cli.approval_prompt import ApprovalPrompter
from turnkeep.cli.connect import client_for
from turnkeep.cli.console import console
from turnkeep.cli.options import Address, ConfigPath, Namespace
from turnkeep.cli.process import client_and_worker
from turnkeep.cli.render import TurnRenderer
from turnkeep.client.history import TurnView, read_turn
from turnkeep.client.live import MessageEvent
from turnkeep.client.sessions import SessionView, read_session
from turnkeep.client.turns import TurnHandle, get_turn, start_turn
from turnkeep.config.files import find_config, load_settings
from turnkeep.config.settings import Settings
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.workflows.turn_io import (
    TurnCancelledError,
    TurnInput,
    TurnResult,
    agent_task_queue,
)

# What `run` and `watch` exit with once Ctrl-C has cancelled the turn: 128 + SIGINT, as a
# shell reports a command that Ctrl-C stopped (scripts can tell it from a finished turn).
INTERRUPTED_EXIT = 130

app = typer.Typer()


def _default_agent(settings: Settings) -> str:
    return "default" if "default" in settings.agents else next(iter(settings.agents))


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="What to ask the agent ('-' reads stdin).")],
    agent: Annotated[str | None, typer.Option(help="Agent from the config.")] = None,
    model: Annotated[str | None, typer.Option(help="Model override, if the agent allows.")] = None,
    max_iterations: Annotated[int | None, typer.Option(help="Tool-loop cap override.")] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: Annotated[
        bool | None,
        typer.Option(help="Run a worker in this process (default: only on the embedded server)."),
    ] = None,
    workflow_id: Annotated[str | None, typer.Option("--id", help="Workflow id.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the TurnResult as JSON.")] = False,
) -> None:
    """Start a turn and stream its messages as the loop runs. Ctrl-C cancels the turn."""
    settings = load_settings(config)
    if prompt == "-":
        prompt = sys.stdin.read().strip()
    turn = TurnInput(
        agent=agent or _default_agent(settings),
        messages=[prompt],  # a bare string is a user message
        model=model,
        max_iterations=max_iterations,
    )

    async def go() -> None:
        async with client_and_worker(address, namespace, settings, config, worker=worker) as (
            client,
            embedded,
        ):
            handle = await start_turn(
                client,
                turn,
                workflow_id=workflow_id,
                task_queue=agent_task_queue(settings.task_queue, turn.agent),
            )
            _announce(handle, embedded)
            result, interrupted = await _stream(handle)
        if json_out:
            print(result.model_dump_json(indent=2))
        if interrupted:
            raise typer.Exit(INTERRUPTED_EXIT)

    asyncio.run(go())


def _announce(handle: TurnHandle, embedded: ServerInfo | None) -> None:
    console.print(f"[bold]turn[/] {handle.workflow_id}")
    link = embedded.workflow_url(handle.workflow_id) if embedded else None
    if link:
        console.print(f"[bold]Web UI[/] {link}")


async def _stream(handle: TurnHandle, start: int = 0) -> tuple[TurnResult, bool]:
    """Print each message as it comes, asking about calls that await approval (on a
    terminal); on Ctrl-C cancel the turn and show the repair. The turn's result, and whether
    Ctrl-C cancelled it."""
    renderer = TurnRenderer(console)
    interrupted = False
    try:
        async with ApprovalPrompter.for_turn(handle) as approvals:
            async for event in handle.stream(start, include_tool_results=True):
                if isinstance(event, MessageEvent):
                    approvals.saw(event.message)
                renderer.live(event)
        result = await handle.result()
    except asyncio.CancelledError:
        # Ctrl-C cancels this task; take the cancellation back long enough to cancel the
        # turn itself and read its repaired conversation (fast-agent's uncancel trick).
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        console.print("[yellow]interrupted: cancelling the turn…[/]")
        interrupted = True
        await handle.cancel()
        try:
            result = await handle.result()
        except TurnCancelledError as cancelled:
            if cancelled.result is None:
                raise
            result = cancelled.result
    except TurnCancelledError as cancelled:
        if cancelled.result is None:
            raise
        result = cancelled.result
    renderer.summary(result)
    return result, interrupted


@app.command()
def watch(
    workflow_id: str,
    start: Annotated[int, typer.Option(help="Message index to start from.")] = 0,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Attach to a turn started elsewhere and stream it."""
    settings = load_settings(config)

    async def go() -> None:
        client, _ = await client_for(address, namespace, settings, config_file=find_config(config))
        _, interrupted = await _stream(get_turn(client, workflow_id), start)
        if interrupted:
            raise typer.Exit(INTERRUPTED_EXIT)

    asyncio.run(go())


@app.command()
def show(
    workflow_id: str,
    address: Address = None,
    namespace: Namespace = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id",
            help="A run of the turn to show, when the workflow id has been used for more than "
            "one turn (default: the latest). Any run of a turn that continued as new shows it "
            "whole.",
        ),
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the turn (TurnView) as JSON, each message once: its result without "
            "`history` and `final`, which repeat `messages`.",
        ),
    ] = False,
    full: Annotated[
        bool, typer.Option("--full", help="Print long texts and tool results whole, not cut.")
    ] = False,
    config: ConfigPath = None,
) -> None:
    """Print a turn from its history: messages, tool calls and results, timings, usage, stop
    reason and any repair. Running, completed, cancelled or failed; no worker needed. Given a
    session's id, print each of its turns so, open or closed."""
    settings = load_settings(config)

    async def go() -> TurnView | SessionView:
        client, _ = await client_for(address, namespace, settings, config_file=find_config(config))
        session = None if run_id else await read_session(client, workflow_id)
        return session or await read_turn(client, workflow_id, run_id)

    view = asyncio.run(go())
    if isinstance(view, SessionView):
        _show_session(view, json_out=json_out, full=full)
        return
    if json_out:
        sys.stdout.write(view.model_dump_json(indent=2, exclude=_REPEATED) + "\n")
        return
    TurnRenderer(console, full=full).view(view)


def _show_session(view: SessionView, *, json_out: bool, full: bool) -> None:
    if json_out:
        exclude = {"turns": {"__all__": _REPEATED}}
        sys.stdout.write(view.model_dump_json(indent=2, exclude=exclude) + "\n")
        return
    console.print(
        f"[bold]session[/] {escape(view.session_id)} · {view.status} · {len(view.turns)} turns"
    )
    renderer = TurnRenderer(console, full=full)
    for turn in view.turns:
        console.print()
        renderer.view(turn)


# What `show --json` leaves out of a turn's result: the next turn's `history` ends with the
# turn's `messages`, and `final` is the last assistant message among them, so written out they
# would repeat every message, however large, two or three times.
_REPEATED = {"result": {"history", "final"}}


@app.command()
def cancel(
    workflow_id: str,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Cancel a running turn; its conversation is repaired and stays readable."""
    settings = load_settings(config)

    async def go() -> None:
        client, _ = await client_for(address, namespace, settings, config_file=find_config(config))
        handle = get_turn(client, workflow_id)
        await handle.cancel()
        try:
            await handle.result()
        except TurnCancelledError as cancelled:
            if cancelled.result is not None:
                TurnRenderer(console).summary(cancelled.result)
            return
        console.print("the turn had already finished")

    asyncio.run(go())
