"""The commands about sessions: ``chat`` talks with an agent in a session, line by line;
``sessions`` lists sessions."""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import typer

from turnkeep.cli.approval_prompt import ApprovalPrompter, stdin_lines
from turnkeep.cli.commands.turns import _default_agent
from turnkeep.cli.connect import client_for
from turnkeep.cli.console import console
from turnkeep.cli.options import Address, ConfigPath, Namespace
from turnkeep.cli.process import client_and_worker
from turnkeep.cli.render import TurnRenderer
from turnkeep.client.live import MessageEvent
from turnkeep.client.sessions import SessionHandle, open_session
from turnkeep.config.files import find_config, load_settings
from turnkeep.workflows import visibility
from turnkeep.workflows.session_io import SESSION_WORKFLOW_NAME
from turnkeep.workflows.turn_io import agent_task_queue

app = typer.Typer()


@app.command()
def chat(
    agent: Annotated[str | None, typer.Option(help="Agent from the config.")] = None,
    session_id: Annotated[
        str | None, typer.Option("--session", help="Resume this session (default: a new one).")
    ] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    worker: Annotated[
        bool | None,
        typer.Option(help="Run a worker in this process (default: only on the embedded server)."),
    ] = None,
) -> None:
    """Talk with an agent: each line you type is sent to the session and its turn streamed.
    Ctrl-C cancels the running turn (the conversation is repaired, the session goes on);
    Ctrl-C at the prompt, or end of input, leaves (the session stays, resume it with
    --session)."""
    settings = load_settings(config)

    async def go() -> None:
        async with client_and_worker(address, namespace, settings, config, worker=worker) as (
            client,
            _,
        ):
            name = agent or _default_agent(settings)
            options = settings.agents.get(name)
            session = await open_session(
                client,
                agent=name,
                session_id=session_id,
                task_queue=agent_task_queue(settings.task_queue, name),
                on_new_message=options.on_new_message if options else "queue",
            )
            console.print(f"[bold]session[/] {session.session_id}")
            await _repl(session)

    asyncio.run(go())


async def _repl(session: SessionHandle) -> None:
    index = (await session.progress()).count
    renderer = TurnRenderer(console)
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    while True:
        interrupted.clear()
        line = await _read_line(interrupted)
        if line is None:
            return
        if not line.strip():
            continue
        sent = await session.send(line)
        follow = asyncio.ensure_future(_print(session, index, sent.turn, renderer))
        interrupt = asyncio.ensure_future(interrupted.wait())
        await asyncio.wait({follow, interrupt}, return_when=asyncio.FIRST_COMPLETED)
        if not follow.done():
            # Cancel the turn, not the follower: it goes on to print the repair.
            console.print("[yellow]interrupted: cancelling the turn…[/]")
            await session.cancel_turn()
        interrupt.cancel()
        index = await follow


async def _read_line(interrupted: asyncio.Event) -> str | None:
    """The next line typed, or None at end of input or on Ctrl-C."""
    console.print("[bold]>[/] ", end="")
    # The reader shared with the approval prompts: a line a dropped prompt was waiting for
    # comes here, not to a thread of its own.
    read = asyncio.ensure_future(stdin_lines().readline())
    interrupt = asyncio.ensure_future(interrupted.wait())
    await asyncio.wait({read, interrupt}, return_when=asyncio.FIRST_COMPLETED)
    interrupt.cancel()
    if not read.done():
        console.print()
        return None  # the reading (daemon) thread is left blocked; the process exits
    line = read.result()
    return line.rstrip("\n") if line else None


async def _print(session: SessionHandle, start: int, turn: int, renderer: TurnRenderer) -> int:
    """Print the messages up to the end of ``turn``, asking about calls that await approval
    (on a terminal); the index to follow on from."""
    index = start
    async with ApprovalPrompter.for_session(session) as approvals:
        async for event in session.stream(start, until_turn=turn):
            if isinstance(event, MessageEvent):
                index += 1
                approvals.saw(event.message)
            renderer.live(event)
    return index


@app.command()
def sessions(
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    limit: Annotated[int, typer.Option(help="How many to list, newest first.")] = 20,
) -> None:
    """List sessions: id, agent, status, turns, tokens, and when their current run started
    (the last continue-as-new, or the start)."""
    settings = load_settings(config)

    async def go() -> None:
        client, _ = await client_for(address, namespace, settings, config_file=find_config(config))
        query = f"WorkflowType = '{SESSION_WORKFLOW_NAME}'"
        async for execution in client.list_workflows(query, limit=limit):
            attributes = execution.typed_search_attributes
            open_ = execution.status is not None and execution.status.name == "RUNNING"
            console.print(
                f"{execution.id}  agent={attributes.get(visibility.AGENT) or '?'}  "
                f"{'open' if open_ else 'closed'}  "
                f"turns={attributes.get(visibility.ITERATIONS) or 0}  "
                f"tokens={attributes.get(visibility.TOKENS) or 0}  "
                f"since={execution.start_time:%Y-%m-%d %H:%M:%S}"
            )

    asyncio.run(go())
