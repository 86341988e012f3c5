"""Where the commands print what they did: standard output, without rich's highlighting of
numbers and paths (``error:`` lines go to stderr, ``turnkeep/cli/errors.py``)."""

from rich.console import Console

console = Console(highlight=False)
