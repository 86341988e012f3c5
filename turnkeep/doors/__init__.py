"""Front doors: serving a worker's agents to callers that hold no Temporal client, over MCP
(``mcp_server``), HTTP with server-sent events and a web page (``gateway``), and A2A
(``a2a``). Each is a thin layer over turnkeep's client API (``start_turn``, ``open_session``,
``TurnHandle``), never a second implementation of a turn. A door has a Temporal client's
authority only, and starts turns only for the agents the ``Settings`` it was given name."""
