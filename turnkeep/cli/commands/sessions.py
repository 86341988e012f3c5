"""The commands about sessions: ``chat`` talks with an agent in a session, line by line;
``sessions`` lists sessions, ``sessions close`` closes one."""

from __future__ import annotations

import asyncio
import getpass
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated

import typer
from pydantic import BaseModel, ValidationError
from rich.markup import escape
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.service import RPCError

from turnkeep.cli.commands.turns import _default_agent
from turnkeep.cli.console import console
from turnkeep.cli.errors import error_text, print_error
from turnkeep.cli.line_reader import stdin_lines
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
from turnkeep.cli.render import TurnRenderer, plural, utc_time
from turnkeep.cli.target import Target
from turnkeep.cli.wait_prompt import WaitPrompter
from turnkeep.client.live import MessageEvent
from turnkeep.client.sessions import SessionHandle, get_session, open_session, session_state
from turnkeep.client.turns import get_turn
from turnkeep.config.problems import validator_message
from turnkeep.contract.rewind import Rewind
from turnkeep.contract.session_io import SESSION_WORKFLOW_NAME, SessionInput, SessionResult
from turnkeep.contract.turn_io import TaskPriority, TurnOverrides, agent_task_queue
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.workflows import visibility

app = typer.Typer()
# `sessions` lists them; its subcommands act on one.
sessions_app = typer.Typer(subcommand_metavar="[COMMAND [ARGS]...]")


@app.command()
def chat(
    agent: Annotated[str | None, typer.Option(help="Agent from the config.")] = None,
    session_id: Annotated[
        str | None, typer.Option("--session", help="Resume this session (default: a new one).")
    ] = None,
    priority: PriorityOption = None,
    tenant: TenantOption = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: InProcessWorker = None,
) -> None:
    """Talk with an agent: each line you type is sent to the session and its turn streamed.
    Ctrl-C cancels the running turn (the conversation is repaired, the session goes on);
    Ctrl-C at the prompt, or end of input, leaves: the session stays open, and the command
    says how to resume or close it. A turn that fails is told in an `error:` line, the
    session goes on, and the command exits with code 2 at the end."""
    target = Target.of(address, namespace, config)
    settings = target.settings
    name = agent or _default_agent(settings)
    in_process = runs_worker(address, worker)
    scheduling = _scheduling(priority, tenant)
    if session_id is None:  # a resumed session keeps its own agent
        ready_to_start(settings, name, TurnOverrides(), in_process=in_process)

    async def go(client: Client, _: ServerInfo | None) -> tuple[str, int]:
        options = settings.agents.get(name)
        session = await open_session(
            client,
            agent=name,
            session_id=session_id,
            task_queue=agent_task_queue(settings.task_queue, name),
            on_new_message=options.on_new_message if options else "queue",
            priority=scheduling.priority,
            tenant=scheduling.tenant,
        )
        console.print(f"[bold]session[/] {session.session_id}")
        # Where its turns wait for a worker (a resumed session keeps its own queue).
        queue = None if in_process else (await session.handle.describe()).task_queue
        return session.session_id, await _repl(session, queue)

    left_open(*target.run_with_worker(go, worker=worker))


def _scheduling(priority: TaskPriority | None, tenant: str | None) -> SessionInput:
    """``--priority`` and ``--tenant`` checked as a session checks them, or a usage error."""
    try:
        return SessionInput.model_validate({"agent": "-", "priority": priority, "tenant": tenant})
    except ValidationError as err:
        first = err.errors()[0]
        message = validator_message(first["msg"])
        raise typer.BadParameter(message, param_hint=f"--{first['loc'][0]}") from None


def left_open(session_id: str, code: int) -> None:
    """Say how to go on with the open session ``session_id``, then exit with ``code``."""
    console.print(
        f"the session stays open: resume it with `turnkeep chat --session {session_id}`, end "
        f"it with `turnkeep sessions close {session_id}`"
    )
    if code:
        raise typer.Exit(code)


async def _repl(session: SessionHandle, unpolled_queue: str | None) -> int:
    """Send each line typed and follow its turn, until end of input or Ctrl-C at the prompt.
    The exit code: 2 if a turn failed (each told as it happens), else 0. ``unpolled_queue``:
    the queue to look at for a worker when a turn is slow to start (None: this process runs
    the worker)."""
    index = (await session.progress()).count
    renderer = TurnRenderer(console)
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    code = 0
    while True:
        interrupted.clear()
        line = await _read_line(interrupted)
        if line is None:
            return code
        if not line.strip():
            continue
        unpolled = (
            asyncio.ensure_future(warn_if_unpolled(session.client, unpolled_queue))
            if unpolled_queue
            else None
        )
        try:
            sent = await session.send(line)
            follow = asyncio.ensure_future(_print(session, index, sent.turn, renderer, unpolled))
            interrupt = asyncio.ensure_future(interrupted.wait())
            await asyncio.wait({follow, interrupt}, return_when=asyncio.FIRST_COMPLETED)
            if not follow.done():
                # Cancel the turn, not the follower: it goes on to print the repair.
                console.print("[yellow]interrupted: cancelling the turn…[/]")
                await session.cancel_turn()
            interrupt.cancel()
            index = await follow
        finally:
            if unpolled is not None:
                unpolled.cancel()
        failure = await _failure(session, sent.turn_id)
        if failure is not None:
            print_error(error_text(failure))
            code = 2


async def _failure(session: SessionHandle, turn_id: str) -> WorkflowFailureError | None:
    """Why the turn ``turn_id`` of the session failed (its messages go unanswered, and the
    session goes on); None if it did not."""
    turn = get_turn(session.client, turn_id)
    status = (await turn.handle.describe()).status
    if status in (None, WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CANCELED):
        return None
    try:
        await turn.handle.result()
    except WorkflowFailureError as err:
        return err
    return None


async def _read_line(interrupted: asyncio.Event) -> str | None:
    """The next line typed, or None at end of input or on Ctrl-C."""
    console.print("[bold]>[/] ", end="")
    # The reader shared with the prompts about waits: a line a dropped prompt was waiting for
    # comes here, not to a thread of its own.
    read = asyncio.ensure_future(stdin_lines().readline())
    interrupt = asyncio.ensure_future(interrupted.wait())
    await asyncio.wait({read, interrupt}, return_when=asyncio.FIRST_COMPLETED)
    interrupt.cancel()
    if not read.done():
        console.print()
        return None  # the reading (daemon) thread is left blocked; the process exits
    line = read.result()
    if not line:
        console.print()  # end of input: what follows starts on a line of its own
        return None
    return line.rstrip("\n")


async def _print(
    session: SessionHandle,
    start: int,
    turn: int,
    renderer: TurnRenderer,
    unpolled: asyncio.Future[None] | None = None,
) -> int:
    """Print the messages up to the end of ``turn``, asking about calls that await approval
    (on a terminal); the index to follow on from. ``unpolled`` (the look for a worker) is
    cancelled once the turn's first message comes."""
    index = start
    async with WaitPrompter.for_session(session) as approvals:
        async for event in session.stream(start, until_turn=turn):
            if unpolled is not None:
                unpolled.cancel()
            if isinstance(event, MessageEvent):
                index += 1
                approvals.saw(event.message)
            renderer.live(event)
    return index


@sessions_app.callback(invoke_without_command=True)
def sessions(
    ctx: typer.Context,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    limit: Annotated[int, typer.Option(help="How many to list, newest first.", min=1)] = 20,
) -> None:
    """List sessions, one row each, newest first: id, agent, open or closed, turns, tokens,
    and when the session started. With more sessions than --limit, the open ones come first,
    then those closed last. `turnkeep sessions close ID` closes one."""
    if ctx.invoked_subcommand is not None:
        return
    rows = Target.of(address, namespace, config).run(lambda client: session_rows(client, limit))
    if not rows:
        console.print("no sessions")
    for row in rows:
        console.print(
            f"{escape(row.session_id)} · agent {escape(row.agent or '?')} · {row.state} · "
            f"{plural(row.turns, 'turn')} · {plural(row.tokens, 'token')} · started "
            f"{utc_time(row.started)}"
        )


class SessionRow(BaseModel):
    """A session as ``turnkeep sessions`` lists it: from its current run (the last, once it
    has ended) and the start of its first."""

    session_id: str
    agent: str | None
    state: str  # open, closed, or how it ended otherwise (terminated, failed...)
    turns: int
    tokens: int
    started: datetime


# Every run of a session but the one it is on (or ended in) has continued as new: one row
# per session is the run of each that has not.
_SESSIONS_QUERY = (
    f"WorkflowType = '{SESSION_WORKFLOW_NAME}' AND ExecutionStatus != 'ContinuedAsNew'"
)


async def session_rows(client: Client, limit: int) -> list[SessionRow]:
    """Up to ``limit`` sessions, newest first. The server lists running workflows first, then
    closed ones by their close, so past ``limit`` these are the open sessions and the last
    closed; each started when its first run did."""
    executions = [e async for e in client.list_workflows(_SESSIONS_QUERY, limit=limit)]
    starts = await asyncio.gather(*(_first_start(client, e) for e in executions))
    rows = [
        SessionRow(
            session_id=execution.id,
            agent=execution.typed_search_attributes.get(visibility.AGENT),
            state=session_state(execution.status),
            turns=execution.typed_search_attributes.get(visibility.ITERATIONS) or 0,
            tokens=execution.typed_search_attributes.get(visibility.TOKENS) or 0,
            started=started,
        )
        for execution, started in zip(executions, starts, strict=True)
    ]
    rows.sort(key=lambda row: row.started, reverse=True)
    return rows


async def _first_start(client: Client, execution: WorkflowExecution) -> datetime:
    """When the session started: its first run's start (a session that continued as new is
    listed by its current run; a listing does not say which run was first, a description
    does)."""
    try:
        described = await client.get_workflow_handle(
            execution.id, run_id=execution.run_id
        ).describe()
        first = described.raw_description.workflow_execution_info.first_run_id
        if not first or first == execution.run_id:
            return execution.start_time
        described = await client.get_workflow_handle(execution.id, run_id=first).describe()
    except RPCError:
        return execution.start_time  # the first run is past the namespace's retention
    return described.start_time


@sessions_app.command("close")
def close(
    session_id: Annotated[str, typer.Argument(metavar="SESSION_ID", help="The session (its id).")],
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: InProcessWorker = None,
) -> None:
    """Close a session: it answers any message still queued, then ends. It stays readable
    (`turnkeep show ID`) and takes no more messages."""
    target = Target.of(address, namespace, config)

    async def go(client: Client, _: ServerInfo | None) -> SessionResult | None:
        session = get_session(client, session_id)
        described = await _session_described(session)
        if described.status != WorkflowExecutionStatus.RUNNING:
            console.print(
                f"session {escape(session_id)} was already {session_state(described.status)}"
            )
            return None
        async with _worker_watch(client, described):
            await session.close()
            return await session.result()

    ended = target.run_with_worker(go, worker=worker)
    if ended is not None:
        console.print(f"closed session {escape(session_id)} · {plural(ended.turns, 'turn')}")


@app.command()
def rewind(
    session_id: Annotated[str, typer.Argument(metavar="SESSION_ID", help="The session (its id).")],
    to_turn: Annotated[
        int,
        typer.Option(
            "--to-turn",
            min=0,
            help="Go back to the conversation as it was once this turn had ended (0: empty).",
        ),
    ],
    cancel_running: Annotated[
        bool,
        typer.Option(
            "--cancel-running",
            help="Cancel the running turn first (its conversation repaired), then rewind.",
        ),
    ] = False,
    by: Annotated[str | None, typer.Option(help="Who rewinds (default: the user name).")] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: InProcessWorker = None,
) -> None:
    """Rewind a session: its next turn sees the conversation as it was once turn --to-turn had
    ended, as if the turns after had not happened. Their workflows and messages stay for the
    audit (`turnkeep show SESSION_ID` marks them), turn numbers go on counting up, and money
    spent stays spent. Refused while a turn runs, unless --cancel-running."""
    target = Target.of(address, namespace, config)

    async def go(client: Client, _: ServerInfo | None) -> Rewind:
        session = get_session(client, session_id)
        described = await _session_described(session)
        async with _worker_watch(client, described):
            return await session.rewind(
                to_turn, by=by or getpass.getuser(), cancel_running=cancel_running
            )

    done = target.run_with_worker(go, worker=worker)
    console.print(
        f"rewound session {escape(session_id)} from turn {done.from_turn} to turn "
        f"{done.to_turn}; its next turn is turn {done.turns + 1}"
    )


async def _session_described(session: SessionHandle) -> WorkflowExecutionDescription:
    """The session's workflow, described; a ``BadParameter`` when the id names another kind."""
    described = await session.handle.describe()
    if described.workflow_type != SESSION_WORKFLOW_NAME:
        raise typer.BadParameter(
            f"{session.session_id!r} is a {described.workflow_type}, not a session",
            param_hint="SESSION_ID",
        )
    return described


@asynccontextmanager
async def _worker_watch(
    client: Client, described: WorkflowExecutionDescription
) -> AsyncIterator[None]:
    """While the block runs, a warning if no worker polls the session's queue: what the block
    asks of the session is done there."""
    unpolled = asyncio.ensure_future(
        warn_if_unpolled(
            client,
            described.task_queue,
            what="the session",
            hint="start `turnkeep worker` with its agent in its config, or --worker "
            "to run one here",
        )
    )
    try:
        yield
    finally:
        unpolled.cancel()
