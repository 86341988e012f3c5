"""The ``turnkeep`` command line (``turnkeep.cli.main``), one module per command group
under ``commands/``. It may use every part of turnkeep; nothing in turnkeep imports it."""
