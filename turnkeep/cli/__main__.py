"""``python -m turnkeep.cli``: the ``turnkeep`` command, for tests and background servers that
start it without the installed script."""

from turnkeep.cli.main import main

main()
