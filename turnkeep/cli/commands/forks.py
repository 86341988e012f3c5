"""``turnkeep fork``: a new session whose conversation is a session's or a turn's first
messages (``turnkeep.client.forks``), then a message of your own if given."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from temporalio.client import Client

from turnkeep.cli.commands.sessions import _failure, _print, _scheduling, left_open
from turnkeep.cli.console import console
from turnkeep.cli.errors import error_text, print_error
from turnkeep.cli.options import (
    Address,
    ConfigPath,
    InProcessWorker,
    Namespace,
    PriorityOption,
    TenantOption,
)
from turnkeep.cli.process import refuse_unrunnable, runs_worker
from turnkeep.cli.render import TurnRenderer
from turnkeep.cli.target import Target
from turnkeep.client.forks import agent_of, described_source, fork
from turnkeep.contract.turn_io import TurnOverrides, agent_task_queue
from turnkeep.devserver.embedded import ServerInfo

app = typer.Typer()


@app.command(name="fork")
def fork_command(
    source: Annotated[
        str,
        typer.Argument(metavar="TURN_OR_SESSION", help="The id of the session or turn to fork."),
    ],
    at: Annotated[
        int,
        typer.Option(
            "--at",
            help="How many of its messages the fork starts with, counted from 1 as `turnkeep "
            "show` prints them (a session: every turn's messages in order; a turn: its own).",
        ),
    ],
    agent: Annotated[
        str | None, typer.Option(help="The fork's agent (default: the source's).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="The model of the fork's turns, where the agent lets a turn choose."),
    ] = None,
    message: Annotated[
        str | None,
        typer.Option(help="Send this to the fork, and print its answer (default: send nothing)."),
    ] = None,
    priority: PriorityOption = None,
    tenant: TenantOption = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: InProcessWorker = None,
) -> None:
    """Start a new session whose conversation is the first --at messages of a session or turn
    (a cut inside a tool batch answers its calls as interrupted), then send it --message if
    given. The source is untouched; the fork's `TurnkeepForkOf` says where it came from. Go on
    with `turnkeep chat --session ID`."""
    target = Target.of(address, namespace, config)
    settings = target.settings
    in_process = runs_worker(address, worker)
    scheduling = _scheduling(priority, tenant)

    async def go(client: Client, _: ServerInfo | None) -> tuple[str, int]:
        name = agent or await agent_of(client, await described_source(client, source))
        if name:
            # An agent or model this config knows cannot run: refused before anything starts.
            refuse_unrunnable(settings, name, TurnOverrides(model=model), in_process=in_process)
        forked = await fork(
            client,
            source,
            at=at,
            agent=agent,
            model=model,
            task_queue=agent_task_queue(settings.task_queue, name) if name else None,
            priority=scheduling.priority,
            tenant=scheduling.tenant,
        )
        start = (await forked.progress()).count
        console.print(
            f"[bold]session[/] {escape(forked.session_id)} · forked from {escape(source)} at "
            f"message {at}"
        )
        if message is None:
            return forked.session_id, 0
        sent = await forked.send(message)
        await _print(forked, start, sent.turn, TurnRenderer(console))
        failure = await _failure(forked, sent.turn_id)
        if failure is not None:
            print_error(error_text(failure))
            return forked.session_id, 2
        return forked.session_id, 0

    left_open(*target.run_with_worker(go, worker=worker))
