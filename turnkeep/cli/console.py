"""Where the commands print what they did: standard output, without rich's highlighting of
numbers and paths (``error:`` lines go to stderr, ``turnkeep.cli.errors``).

Lines are never wrapped by the CLI: a terminal wraps a long line on screen, and a file or a
pipe gets it whole, so a hint to copy (``turnkeep approve TURN CALL``) or a URL stays on one
line wherever it is read. With ``--json``, standard output carries the JSON alone, and
everything else a command says goes to stderr (``CommandConsole.to_stderr``)."""

from __future__ import annotations

import sys

from rich.console import Console


class CommandConsole(Console):
    def __init__(self, *, stderr: bool = False) -> None:
        super().__init__(highlight=False, soft_wrap=True, stderr=stderr)

    def to_stderr(self) -> None:
        """Print to stderr from now on (``--json``: stdout is for the JSON). Made again rather
        than pointed at stderr: a console settles its colours from the stream it is made for,
        and stderr may be a file when stdout is a terminal, or the other way round."""
        super().__init__(highlight=False, soft_wrap=True, stderr=True)


console = CommandConsole()
# What a command notes about how it runs (the built-in agent, with no config): on stderr
# always, so that a script reading stdout never sees it.
notes = CommandConsole(stderr=True)


def print_json(text: str) -> None:
    """``text`` (a JSON document) on stdout, alone: the one thing ``--json`` writes there."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
