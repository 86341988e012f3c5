"""The ``turnkeep`` command line: run a turn and stream it, run workers and the dev server,
watch, show and cancel turns.

With no server address (no ``--address``, ``TEMPORAL_ADDRESS`` or ``TEMPORAL_PROFILE``),
``run`` uses an embedded Temporal dev server with its Web UI, started in the background on a
SQLite file under the state directory so turns and the UI outlive the command, and runs the
turn on an in-process worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.markup import escape
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError
from temporalio.worker import Worker

from turnkeep.payloads.codec import EncryptionError
from turnkeep.payloads.storage import (
    PayloadStorageConfigError,
    PayloadStorageError,
    SweepReport,
    collect,
    describe_duration,
    payload_directory,
)
from turnkeep.settings import Origin, Retention, Settings
from turnkeep.worker.build import build_worker, freeze_startup_heap
from turnkeep.worker.client import TurnCancelledError, TurnHandle, get_turn, start_turn
from turnkeep.worker.codec_server import (
    CodecServer,
    CodecServerError,
    background_codec_server_url,
    ensure_background_codec_server,
    stop_background_codec_server,
)
from turnkeep.worker.config import ConfigError, find_config, load_settings
from turnkeep.worker.connection import TemporalUnreachableError, address_configured, connect
from turnkeep.worker.embedded import HOST as EMBEDDED_HOST
from turnkeep.worker.embedded import (
    EmbeddedServer,
    EmbeddedServerError,
    ServerInfo,
    ensure_background_server,
    state_dir,
    stop_background_server,
)
from turnkeep.worker.render import TurnRenderer
from turnkeep.worker.search_attributes import WANTED, Registration, SetupError, register, type_name
from turnkeep.worker.turn_history import TurnHistoryError, TurnView, describe_failure, read_turn
from turnkeep.workflows.turn_io import TurnInput, TurnResult

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Durable agent turns on Temporal: fast-agent's tool loop as a workflow.",
)
console = Console(highlight=False)
# Errors go to stderr whole on one line (no wrapping), so scripts can read them.
errors = Console(stderr=True, highlight=False, soft_wrap=True)

Address = Annotated[
    str | None, typer.Option(help="Temporal frontend host:port (default: TEMPORAL_ADDRESS).")
]
Namespace = Annotated[str | None, typer.Option(help="Temporal namespace.")]
ConfigPath = Annotated[
    Path | None, typer.Option("--config", "-c", help="turnkeep.yaml (default: ./turnkeep.yaml).")
]


class _Options:
    debug = False  # `--debug`: a traceback instead of the one-line error


@app.callback()
def _global_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="On an error, print the traceback too.")
    ] = False,
) -> None:
    _Options.debug = debug
    _log_to_stderr(debug)


def _log_to_stderr(debug: bool) -> None:
    """Warnings and errors logged by the SDK or an in-process worker (an activity that failed,
    with its traceback) as one line each; with ``--debug``, whole and from level INFO."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(name)s: %(message)s") if debug else _OneLine()
    )
    logging.basicConfig(level=logging.INFO if debug else logging.WARNING, handlers=[handler])
    logging.captureWarnings(True)  # the SDK's warnings too (a workflow's unfinished handlers)


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage().partition(chr(10))[0]}"


# Mistakes a user makes (a config, an agent, a model, an id) and conditions outside turnkeep
# (a server down, a swept payload): each is told in one line, with exit code 2.
_USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    EmbeddedServerError,
    PayloadStorageConfigError,
    # A turn's stored payload is missing (swept, or another directory).
    PayloadStorageError,
    # A payload this config has no key for, or one that fails authentication.
    EncryptionError,
    CodecServerError,
    TemporalUnreachableError,
    TurnHistoryError,
    SetupError,
    # The server refused a request: an unknown workflow id, a namespace that does not exist.
    RPCError,
    # The turn failed before it could run: an unknown agent, a model it may not use.
    WorkflowFailureError,
)


def main() -> None:
    code = 0
    try:
        app()  # ends with SystemExit, as click does in standalone mode
    except SystemExit as done:
        code = _exit_code(done)
    except Exception as err:
        code = _report(err)
    # Leave without interpreter finalization, whatever the outcome: the Temporal client's Rust
    # threads can still hold callbacks into Python when a command returns, and finalizing
    # under them aborts the process ("PyGILState_Release … finalizing", SIGABRT) instead of
    # exiting with the command's code. Everything a command opened is closed by now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _report(err: Exception) -> int:
    """Print ``err`` as one line on stderr (with ``--debug``, after its traceback) and return
    the exit code: 2 for a user's mistake, 1 for anything else (a bug in turnkeep)."""
    if _Options.debug:
        traceback.print_exception(err)
    known = isinstance(err, _USER_ERRORS)
    line = _error_text(err) if known else f"{type(err).__name__}: {err}"
    hint = "" if known or _Options.debug else " (turnkeep --debug … shows the traceback)"
    errors.print(f"[red]error:[/] {escape(line)}{hint}")
    return 2 if known else 1


def _error_text(err: Exception) -> str:
    if isinstance(err, WorkflowFailureError):
        return f"the turn failed: {describe_failure(err.cause)}"
    if isinstance(err, RPCError):
        return f"the Temporal server refused the request: {err.message}"
    return str(err)


def _exit_code(done: SystemExit) -> int:
    """The status ``sys.exit(code)`` would give: None is 0, a message is printed and is 1."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)
    return 1


async def _connect(
    address: str | None,
    namespace: str | None,
    settings: Settings,
    *,
    config_file: Path | None = None,
) -> tuple[Client, ServerInfo | None]:
    """A client for the given server, or for the embedded one when none is configured. The
    settings give it the workers' payload storage and encryption keys, so it can read what they
    write. With encryption on, the embedded server's Web UI decodes through a codec server,
    which is started from ``config_file`` (the file the settings came from) when it is given."""
    if address is None and not address_configured():
        info = await ensure_background_server(codec_endpoint=background_codec_server_url(settings))
        console.print(f"[dim]embedded Temporal server at {info.address} · Web UI {info.ui_url}[/]")
        await _background_codec_server(settings, config_file, info)
        return await connect(info.address, info.namespace, settings=settings), info
    return await connect(address, namespace, settings=settings), None


async def _background_codec_server(
    settings: Settings, config_file: Path | None, info: ServerInfo
) -> None:
    if settings.encryption is None:
        return
    wanted = background_codec_server_url(settings)
    if wanted is None:
        console.print(
            "[dim]payloads are encrypted; set encryption.codec_server.token to read them in "
            "the Web UI[/]"
        )
        return
    if info.codec_endpoint != wanted:
        console.print(
            f"[yellow]the background server's Web UI decodes with "
            f"{info.codec_endpoint or 'no codec server'}, not {wanted}: restart it "
            "(turnkeep server --stop) to change that[/]"
        )
    if config_file is not None:
        url = await ensure_background_codec_server(settings, config_file, ui_origin=info.ui_url)
        console.print(f"[dim]codec server {url} · sign in at {url}/login to decrypt in the UI[/]")


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
        client, embedded = await _connect(
            address, namespace, settings, config_file=find_config(config)
        )
        in_process = worker if worker is not None else embedded is not None
        runner = _worker(client, settings, config) if in_process else contextlib.nullcontext()
        async with runner:
            handle = await start_turn(
                client, turn, workflow_id=workflow_id, task_queue=settings.task_queue
            )
            _announce(handle, embedded)
            result = await _stream(handle)
        if json_out:
            print(result.model_dump_json(indent=2))

    asyncio.run(go())


def _worker(client: Client, settings: Settings, config: Path | None) -> Worker:
    """``build_worker``, with what the config gets wrong as a ``ConfigError``: an agent naming
    a server or hook that is not there, a hook that does not import, storage or keys the
    client does not share."""
    try:
        return build_worker(client, settings)
    except (ValueError, TypeError, ImportError, AttributeError) as err:
        where = find_config(config) or "the configuration"
        raise ConfigError(f"{where} cannot run a worker: {err}") from err


def _announce(handle: TurnHandle, embedded: ServerInfo | None) -> None:
    console.print(f"[bold]turn[/] {handle.workflow_id}")
    link = embedded.workflow_url(handle.workflow_id) if embedded else None
    if link:
        console.print(f"[bold]Web UI[/] {link}")


async def _stream(handle: TurnHandle, start: int = 0) -> TurnResult:
    """Print each message as it comes; on Ctrl-C cancel the turn and show the repair."""
    renderer = TurnRenderer(console)
    try:
        async for message in handle.messages(start, include_tool_results=True):
            renderer.message(message)
        result = await handle.result()
    except asyncio.CancelledError:
        # Ctrl-C cancels this task; take the cancellation back long enough to cancel the
        # turn itself and read its repaired conversation (fast-agent's uncancel trick).
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        console.print("[yellow]interrupted: cancelling the turn…[/]")
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
    return result


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
        client, _ = await _connect(address, namespace, settings, config_file=find_config(config))
        await _stream(get_turn(client, workflow_id), start)

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
    reason and any repair. Running, completed, cancelled or failed; no worker needed."""
    settings = load_settings(config)

    async def go() -> TurnView:
        client, _ = await _connect(address, namespace, settings, config_file=find_config(config))
        return await read_turn(client, workflow_id, run_id)

    view = asyncio.run(go())
    if json_out:
        sys.stdout.write(view.model_dump_json(indent=2, exclude=_REPEATED) + "\n")
        return
    TurnRenderer(console, full=full).view(view)


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
        client, _ = await _connect(address, namespace, settings, config_file=find_config(config))
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


@app.command()
def gc(
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            help="Remove files unused for this long instead of payload_storage.retention "
            "(7d, 12h, 90m, or seconds)."
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Only report what would be removed.")] = False,
    list_files: Annotated[bool, typer.Option("--list", help="Print each file removed.")] = False,
) -> None:
    """Delete local payload files that nobody has stored or read for payload_storage.retention
    and no running turn references (workers also do this on their own, at start and hourly)."""
    settings = load_settings(config)
    storage = settings.payload_storage
    if storage.driver == "s3":
        console.print(
            "payload_storage.driver is s3: turnkeep never deletes S3 objects; expire them with "
            "a bucket lifecycle rule (see the README)"
        )
        return
    if storage.driver == "off":
        console.print("payload_storage is off: nothing is stored, nothing to collect")
        return
    retention = storage.retention if older_than is None else _duration(older_than)
    if retention is None:
        console.print("payload_storage.retention is off: nothing removed (--older-than overrides)")
        return
    directory = payload_directory(settings)

    async def go() -> SweepReport:
        # The server says which turns are running: their payloads stay, however old.
        client, _ = await _connect(address, namespace, settings, config_file=find_config(config))
        return await collect(directory, retention, client, dry_run=dry_run)

    report = asyncio.run(go())
    if list_files:
        for path in report.removed:
            print(path)
    console.print(
        f"{'would remove' if dry_run else 'removed'} {len(report.removed)} file(s) "
        f"({report.removed_bytes:,} bytes) unused for {describe_duration(retention)}; "
        f"kept {report.kept} ({report.kept_bytes:,} bytes"
        + (f", {report.in_use} of them old but used by running turns" if report.in_use else "")
        + f") in {directory}"
    )
    for error in report.errors:
        console.print(f"[yellow]could not remove[/] {error}")
    if report.errors:
        raise typer.Exit(1)


def _duration(text: str) -> timedelta:
    try:
        value = TypeAdapter(Retention).validate_python(text)
    except ValidationError as err:
        raise typer.BadParameter(
            f"{text!r} is not a duration (7d, 12h, 90m, or seconds): "
            + "; ".join(e["msg"] for e in err.errors()),
            param_hint="--older-than",
        ) from None
    if value is None:
        raise typer.BadParameter("give a duration, not off", param_hint="--older-than")
    return value


@app.command()
def setup(address: Address = None, namespace: Namespace = None, config: ConfigPath = None) -> None:
    """Register turnkeep's search attributes (TurnkeepAgent, TurnkeepModel, TurnkeepStatus,
    TurnkeepStopReason, TurnkeepIterations, TurnkeepTokens) on the namespace, so turns can be
    filtered by them. Once per namespace; running it again changes nothing."""
    settings = load_settings(config)

    async def go() -> Registration:
        client, _ = await _connect(address, namespace, settings, config_file=find_config(config))
        console.print(f"namespace [bold]{escape(client.namespace)}[/]")
        return await register(client)

    found = asyncio.run(go())
    for name in found.present:
        verb = "added" if name in found.added else "already registered"
        console.print(f"{verb}: {name} ({type_name(WANTED[name])})")
    for name, kind in found.conflicting.items():
        console.print(
            f"[red]conflict:[/] {name} is registered as {kind} but turnkeep needs "
            f"{type_name(WANTED[name])}, so turns will not set it. Temporal cannot change the "
            f"type: remove it (`temporal operator search-attribute remove --name {name}`) and "
            "run `turnkeep setup` again."
        )
    if found.conflicting:
        raise typer.Exit(1)


@app.command("worker")
def run_worker(
    address: Address = None, namespace: Namespace = None, config: ConfigPath = None
) -> None:
    """Run a worker for TurnWorkflow against a Temporal server (connection from the env)."""
    settings = load_settings(config)

    async def go() -> None:
        client = await connect(address, namespace, settings=settings)
        async with _worker(client, settings, config):
            console.print(
                f"worker on task queue [bold]{settings.task_queue}[/] · agents: "
                + ", ".join(settings.agents)
            )
            freeze_startup_heap()
            _release_large_blocks()
            await _until_signalled()

    asyncio.run(go())


@app.command()
def server(
    port: Annotated[int, typer.Option(help="gRPC port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Web UI port.")] = 8233,
    db: Annotated[Path | None, typer.Option(help="SQLite file (default: state dir).")] = None,
    stop: Annotated[bool, typer.Option(help="Stop the background server `run` started.")] = False,
    config: ConfigPath = None,
) -> None:
    """Run the embedded Temporal dev server (with Web UI) in the foreground. With encryption
    in the config, a codec server runs beside it and the Web UI decrypts through it."""
    if stop:
        stopped = stop_background_server()
        stop_background_codec_server()
        console.print("stopped" if stopped else "no background server was running")
        return
    settings = load_settings(config)

    async def go() -> None:
        async with contextlib.AsyncExitStack() as stack:
            codec_url = None
            if settings.encryption is not None and settings.encryption.codec_server.token:
                ui_origin = f"http://{EMBEDDED_HOST}:{ui_port}"
                codec = CodecServer(settings.encryption, origins=[ui_origin])
                codec_url = await stack.enter_async_context(codec)
            embedded = EmbeddedServer(
                db_file=db or state_dir() / "temporal.db",
                port=port,
                ui_port=ui_port,
                codec_endpoint=codec_url,
            )
            info = await stack.enter_async_context(embedded)
            console.print(f"Temporal at [bold]{info.address}[/] · Web UI {info.ui_url}")
            if codec_url:
                console.print(
                    f"codec server at [bold]{codec_url}[/] · sign in at {codec_url}/login, "
                    "then turn on the UI's cross-origin credentials (see the README)"
                )
            elif settings.encryption is not None:
                console.print(
                    "payloads are encrypted; set encryption.codec_server.token to read them in "
                    "the Web UI"
                )
            await _until_signalled()

    asyncio.run(go())


@app.command("codec-server")
def codec_server(
    config: ConfigPath = None,
    host: Annotated[
        str | None, typer.Option(help="Listen address (default: encryption.codec_server.host).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (default: encryption.codec_server.port).")
    ] = None,
    origin: Annotated[
        list[str] | None,
        typer.Option(
            help="A Web UI origin (scheme://host:port) whose pages may call it; repeatable, "
            "added to encryption.codec_server.origins."
        ),
    ] = None,
) -> None:
    """Serve Temporal's remote codec protocol, so the Web UI and `temporal workflow show
    --codec-endpoint URL --codec-auth "Bearer TOKEN"` show encrypted payloads decrypted.
    Every request needs encryption.codec_server.token; browsers sign in at URL/login."""
    settings = load_settings(config)
    if settings.encryption is None:
        raise ConfigError("there is no `encryption` in the config, so there is nothing to decode")
    encryption = settings.encryption
    origins = [_origin_option(value) for value in origin or []]

    async def go() -> None:
        async with CodecServer(encryption, host=host, port=port, origins=origins) as server:
            console.print(f"codec server at [bold]{server}[/] · browsers sign in at {server}/login")
            await _until_signalled()

    asyncio.run(go())


def _origin_option(value: str) -> str:
    try:
        return TypeAdapter(Origin).validate_python(value)
    except ValidationError as err:
        raise typer.BadParameter(
            "; ".join(e["msg"] for e in err.errors()), param_hint="--origin"
        ) from None


# glibc's mallopt parameter for the size from which a block gets its own mapping.
_M_MMAP_THRESHOLD = -3


def _release_large_blocks() -> None:
    """Give every block of 128 KiB or more its own mapping, returned to the system when freed.

    By default glibc raises that threshold to the size of each large block freed, up to
    32 MB, so after one large tool result every later result, model input and payload of that
    size is carved from the heap, which it does not give back: the worker would keep its peak
    memory for good. Fixing the threshold turns the adjustment off. Only on glibc; elsewhere
    nothing changes."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, 128 * 1024)


async def _until_signalled() -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()


if __name__ == "__main__":
    main()
