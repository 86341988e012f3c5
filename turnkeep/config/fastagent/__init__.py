"""fast-agent's configuration, as plain data turnkeep's settings and agents build on: its config
keys (``keys``), its MCP target strings (``targets``) and its ``RequestParams``
(``request_params``). Nothing here imports the rest of turnkeep."""
