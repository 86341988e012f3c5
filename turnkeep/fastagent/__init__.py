"""Everything about fast-agent, in one room for whoever ports a fast-agent app.

Its translation is plain data the rest of turnkeep builds on, so it imports nothing of turnkeep
but ``errors``: where its config files are found (``config_files``), its config keys
(``config_keys``), its MCP target strings (``targets``), its ``RequestParams``
(``request_params``) and its model strings (``model_strings``). Its decorator API (``app``:
``fast = FastAgent(...)``, ``@fast.agent``) serves the agents it collects through a worker, so
that one module sits on top instead, and this package imports none of its modules: config and
providers can import the translation without loading the worker.
"""

# The fast-agent commit whose config schema, RequestParams, target parsing and model tables
# turnkeep follows (2026-08-18, on its 0.10 line): they are updated together, from one commit.
FAST_AGENT_COMMIT = "610a2f575c469134479f2101f92255aa4bc642a3"
