"""The options several commands share: which Temporal server, which configuration, and
whether to run a worker in the command's process."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import typer
from pydantic import TypeAdapter, ValidationError

from turnkeep.config.problems import validator_message
from turnkeep.config.settings import AllowedHost, AllowedOrigin, GatewaySettings, ServeSettings
from turnkeep.contract.turn_io import TaskPriority

Address = Annotated[
    str | None, typer.Option(help="Temporal frontend host:port (default: TEMPORAL_ADDRESS).")
]
Namespace = Annotated[str | None, typer.Option(help="Temporal namespace.")]
ConfigPath = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="turnkeep.yaml (default: ./turnkeep.yaml, else fast-agent's config file).",
    ),
]
InProcessWorker = Annotated[
    bool | None,
    typer.Option(help="Run a worker in this process (default: only on the embedded server)."),
]

# A turn's `TurnInput.priority` and `tenant` (a session's, for each of its turns).
PriorityOption = Annotated[
    TaskPriority | None,
    typer.Option(help="Lower the agent's priority for busy workers (never raises it)."),
]
TenantOption = Annotated[
    str | None,
    typer.Option(help="Whose work this is: busy workers share themselves fairly by tenant."),
]


Block = TypeVar("Block", ServeSettings, GatewaySettings)
_HOSTS: TypeAdapter[list[str]] = TypeAdapter(list[AllowedHost])
_ORIGINS: TypeAdapter[list[str]] = TypeAdapter(list[AllowedOrigin])


def extended(block: Block, allowed_hosts: str | None, allowed_origins: str | None) -> Block:
    """``block`` (``serve:`` or ``gateway:``) with ``--allowed-hosts`` and ``--allowed-origins``
    (comma-separated) added to its own, each checked as the config's are."""
    added: dict[str, list[str]] = {}
    asked: list[tuple[str, str | None, TypeAdapter[list[str]]]] = [
        ("allowed_hosts", allowed_hosts, _HOSTS),
        ("allowed_origins", allowed_origins, _ORIGINS),
    ]
    for name, given, adapter in asked:
        if not given:
            continue
        try:
            values: list[str] = adapter.validate_python([v for v in given.split(",") if v.strip()])
        except ValidationError as err:
            message = validator_message(err.errors()[0]["msg"])
            raise typer.BadParameter(message, param_hint="--" + name.replace("_", "-")) from None
        current: list[str] = getattr(block, name)
        added[name] = [*current, *values]
    return block.model_copy(update=added) if added else block
