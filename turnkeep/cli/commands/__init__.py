"""The ``turnkeep`` commands, one module per group, each with a typer app that
``turnkeep.cli.main`` merges into the top-level one."""
