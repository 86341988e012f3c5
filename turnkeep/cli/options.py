"""The options several commands share: which Temporal server, which configuration, and
whether to run a worker in the command's process."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
