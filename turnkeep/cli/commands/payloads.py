"""``gc``: sweep the local payload store on demand, as workers do on their own."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer
from pydantic import TypeAdapter, ValidationError

from turnkeep.cli.console import console
from turnkeep.cli.options import Address, ConfigPath, Namespace
from turnkeep.cli.target import Target
from turnkeep.config.settings import DurationOrOff
from turnkeep.payloads.gc import collect
from turnkeep.payloads.storage import payload_directory
from turnkeep.support.durations import describe_duration

app = typer.Typer()


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
    target = Target.of(address, namespace, config)
    settings = target.settings
    storage = settings.payload_storage
    if storage.driver == "s3":
        console.print(
            "payload_storage.driver is s3: turnkeep never deletes S3 objects; expire them with "
            "a bucket lifecycle rule (see docs/concepts/large-payloads.md)"
        )
        return
    if storage.driver == "off":
        console.print("payload_storage is off: nothing is stored, nothing to collect")
        return
    retention = storage.retention if older_than is None else _duration(older_than)
    if retention is None:
        console.print("payload_storage.retention is off: nothing removed (--older-than overrides)")
        return
    directory = payload_directory(storage, settings.base_dir)

    # The server says which turns are running: their payloads stay, however old.
    report = target.run(lambda client: collect(directory, retention, client, dry_run=dry_run))
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
        value = TypeAdapter(DurationOrOff).validate_python(text)
    except ValidationError as err:
        raise typer.BadParameter(
            f"{text!r} is not a duration (7d, 12h, 90m, or seconds): "
            + "; ".join(e["msg"] for e in err.errors()),
            param_hint="--older-than",
        ) from None
    if value is None:
        raise typer.BadParameter("give a duration, not off", param_hint="--older-than")
    return value
