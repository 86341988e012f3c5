"""fast-agent's configuration, as plain data turnkeep's settings and agents build on: its config
keys (``keys``), its MCP target strings (``targets``) and its ``RequestParams``
(``request_params``). Nothing here imports the rest of turnkeep."""

# The fast-agent commit whose config schema, RequestParams, target parsing and model tables
# turnkeep follows (2026-08-18, on its 0.10 line): they are updated together, from one commit.
FAST_AGENT_COMMIT = "610a2f575c469134479f2101f92255aa4bc642a3"
