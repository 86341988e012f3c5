"""The commands about one turn: ``run`` starts one and streams it, ``watch`` streams one
started elsewhere, ``show`` prints one from its history, ``cancel`` cancels one."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)

from turnkeep.cli.console import console, print_json
from turnkeep.cli.options import (
    Address,
    ConfigPath,
    InProcessWorker,
    Namespace,
    PriorityOption,
    TenantOption,
)
from turnkeep.cli.process import (
    ready_to_start,
    runs_worker,
    warn_if_unpolled,
)
from turnkeep.cli.render import TurnRenderer, plural, status_word
from turnkeep.cli.target import Target
from turnkeep.cli.wait_prompt import WaitPrompter
from turnkeep.client.history import TurnView, read_turn
from turnkeep.client.live import MessageEvent
from turnkeep.client.sessions import SessionView, read_session, turn_number
from turnkeep.client.status import describe_failure
from turnkeep.client.turns import TurnHandle, get_turn, start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.rewind import Rewind, rewound
from turnkeep.contract.session_io import SESSION_WORKFLOW_NAME
from turnkeep.contract.turn_io import (
    TurnCancelledError,
    TurnInput,
    TurnResult,
    agent_task_queue,
)
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

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
    priority: PriorityOption = None,
    tenant: TenantOption = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: InProcessWorker = None,
    workflow_id: Annotated[str | None, typer.Option("--id", help="Workflow id.")] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the turn's id and result as JSON.")
    ] = False,
) -> None:
    """Start a turn and stream its messages as the loop runs. Ctrl-C cancels the turn. A turn
    that could only fail (an empty prompt, an agent the config lacks, a model the agent does
    not allow) is refused before anything starts. With --json, stdout carries the result
    alone, with the turn's id as `turn_id`, and the streamed turn goes to stderr."""
    target = Target.of(address, namespace, config)
    settings = target.settings
    if json_out:
        console.to_stderr()
    if prompt == "-":
        prompt = sys.stdin.read().strip()
        if not prompt:
            raise typer.BadParameter(
                "stdin was empty (there is nothing to ask)", param_hint="PROMPT"
            )
    if not prompt.strip():
        raise typer.BadParameter("empty (there is nothing to ask)", param_hint="PROMPT")
    turn = _turn_input(
        agent=agent or _default_agent(settings),
        messages=[prompt],  # a bare string is a user message
        model=model,
        max_iterations=max_iterations,
        priority=priority,
        tenant=tenant,
    )
    in_process = runs_worker(address, worker)
    ready_to_start(settings, turn.agent, turn.overrides(), in_process=in_process)
    task_queue = agent_task_queue(settings.task_queue, turn.agent)

    async def go(client: Client, embedded: ServerInfo | None) -> tuple[str, TurnResult, bool]:
        handle = await start_turn(client, turn, workflow_id=workflow_id, task_queue=task_queue)
        _announce(handle, embedded)
        unpolled = None if in_process else warn_if_unpolled(client, task_queue)
        return handle.workflow_id, *await _stream(handle, also=unpolled)

    turn_id, result, interrupted = target.run_with_worker(go, worker=worker)
    if json_out:
        # The turn's id first, so a script needs nothing from stderr to follow it up.
        out = {"turn_id": turn_id, **result.model_dump(mode="json")}
        print_json(json.dumps(out, indent=2, ensure_ascii=False))
    if interrupted:
        raise typer.Exit(INTERRUPTED_EXIT)


async def _described_turn(
    turn: TurnHandle, session: str = "`turnkeep chat --session ID` follows one"
) -> WorkflowExecutionDescription:
    """The turn's workflow described, once it is one: another workflow's id (a session's, an
    app's) is a usage error, ``session`` saying what to use for a session instead."""
    described = await turn.handle.describe()
    if described.workflow_type != WORKFLOW_NAME:
        also = f" ({session})" if described.workflow_type == SESSION_WORKFLOW_NAME else ""
        raise typer.BadParameter(
            f"{turn.workflow_id!r} is a {described.workflow_type}, not a turn{also}",
            param_hint="TURN_ID",
        )
    return described


_WORKER_FOR_ITS_AGENT = "start `turnkeep worker` with its agent in its config"

# The options `run` names a turn's fields by, for a value the turn refuses.
_OPTIONS = {
    "agent": "--agent",
    "model": "--model",
    "max_iterations": "--max-iterations",
    "priority": "--priority",
    "tenant": "--tenant",
}


def _turn_input(**fields: object) -> TurnInput:
    """The turn the options describe, or a usage error naming the option that is wrong."""
    try:
        return TurnInput.model_validate(fields)
    except ValidationError as err:
        first = err.errors()[0]
        raise typer.BadParameter(
            first["msg"], param_hint=_OPTIONS.get(str(first["loc"][0]), "PROMPT")
        ) from None


def _announce(handle: TurnHandle, embedded: ServerInfo | None) -> None:
    console.print(f"[bold]turn[/] {handle.workflow_id}")
    link = embedded.workflow_url(handle.workflow_id) if embedded else None
    if link:
        console.print(f"[bold]Web UI[/] {link}")


async def _stream(
    handle: TurnHandle, start: int = 0, *, also: Coroutine[Any, Any, None] | None = None
) -> tuple[TurnResult, bool]:
    """Print each message as it comes, asking about calls that await approval (on a
    terminal); on Ctrl-C cancel the turn and show the repair. The turn's result, and whether
    Ctrl-C cancelled it. ``also`` runs beside until the turn's first message comes (a check
    whether a worker polls its queue)."""
    renderer = TurnRenderer(console)
    interrupted = False
    beside = asyncio.ensure_future(also) if also is not None else None
    try:
        async with WaitPrompter.for_turn(handle) as approvals:
            async for event in handle.stream_with_children(start, include_tool_results=True):
                if beside is not None:
                    beside.cancel()  # the turn runs: a worker took it
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
    finally:
        if beside is not None:
            beside.cancel()
    renderer.summary(result)
    return result, interrupted


@app.command()
def watch(
    workflow_id: Annotated[
        str,
        typer.Argument(
            metavar="TURN_ID", help="The turn's id (`turn TURN_ID`, as `run` prints it)."
        ),
    ],
    start: Annotated[int, typer.Option(help="Message index to start from.")] = 0,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Attach to a turn started elsewhere and stream it."""

    async def go(client: Client) -> None:
        turn = get_turn(client, workflow_id)
        described = await _described_turn(turn)
        unpolled = None
        if described.status == WorkflowExecutionStatus.RUNNING:
            unpolled = warn_if_unpolled(client, described.task_queue, hint=_WORKER_FOR_ITS_AGENT)
        _, interrupted = await _stream(turn, start, also=unpolled)
        if interrupted:
            raise typer.Exit(INTERRUPTED_EXIT)

    Target.of(address, namespace, config).run(go)


@app.command()
def show(
    workflow_id: Annotated[
        str, typer.Argument(metavar="TURN_ID", help="A turn's id, or a session's.")
    ],
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
    target = Target.of(address, namespace, config)
    if json_out:
        console.to_stderr()

    async def go(client: Client) -> TurnView | SessionView:
        session = None if run_id else await read_session(client, workflow_id)
        return session or await read_turn(client, workflow_id, run_id)

    view = target.run(go)
    if isinstance(view, SessionView):
        _show_session(view, json_out=json_out, full=full)
        return
    if json_out:
        print_json(view.model_dump_json(indent=2, exclude=_REPEATED))
        return
    TurnRenderer(console, full=full).view(view)


def _show_session(view: SessionView, *, json_out: bool, full: bool) -> None:
    if json_out:
        exclude = {"turns": {"__all__": _REPEATED}}
        print_json(view.model_dump_json(indent=2, exclude=exclude))
        return
    console.print(
        f"[bold]session[/] {escape(view.session_id)} · {view.status} · "
        f"{plural(len(view.turns), 'turn')}"
    )
    renderer = TurnRenderer(console, full=full)
    rewinds = list(view.rewinds)
    for turn in view.turns:
        number = turn_number(turn.workflow_id)
        while rewinds and number > rewinds[0].turns:
            _show_rewind(rewinds.pop(0))
        console.print()
        renderer.view(turn)
        undone = rewound(view.rewinds, number)
        if undone is not None:
            console.print(f"[yellow]turn {number} was {escape(undone.describe())}[/]")
    for rewind in rewinds:
        _show_rewind(rewind)


def _show_rewind(rewind: Rewind) -> None:
    console.print()
    console.print(f"[bold yellow]⟲ session {escape(rewind.describe())}[/]")


# What `show --json` leaves out of a turn's result: the next turn's `history` ends with the
# turn's `messages`, and `final` is the last assistant message among them, so written out they
# would repeat every message, however large, two or three times.
_REPEATED = {"result": {"history", "final"}}


@app.command()
def cancel(
    workflow_id: Annotated[str, typer.Argument(metavar="TURN_ID", help="The turn's id.")],
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Cancel a running turn; its conversation is repaired and stays readable."""

    async def go(client: Client) -> None:
        handle = get_turn(client, workflow_id)
        described = await _described_turn(handle, session="`turnkeep sessions close` ends one")
        if described.status != WorkflowExecutionStatus.RUNNING:
            console.print(f"the turn had already ended: {await _how_it_ended(handle, described)}")
            return
        await handle.cancel()
        # The turn repairs its conversation on a worker of its queue, if there is one.
        unpolled = asyncio.ensure_future(
            warn_if_unpolled(client, described.task_queue, hint=_WORKER_FOR_ITS_AGENT)
        )
        try:
            await handle.result()
        except TurnCancelledError as cancelled:
            if cancelled.result is not None:
                TurnRenderer(console).summary(cancelled.result)
            return
        finally:
            unpolled.cancel()
        console.print("the turn had already ended: completed")

    Target.of(address, namespace, config).run(go)


async def _how_it_ended(turn: TurnHandle, described: WorkflowExecutionDescription) -> str:
    """A closed turn's status, and for one that failed (or was terminated, or timed out),
    why."""
    status = status_word(described.status)
    if described.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CANCELED):
        return status
    try:
        await turn.handle.result()
    except WorkflowFailureError as err:
        return f"{status}: {describe_failure(err.cause)}"
    return status
