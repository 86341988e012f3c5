"""Front doors: serving a worker's agents over other protocols (MCP, HTTP, A2A), each a thin
layer over turnkeep's client API (``start_turn``, ``open_session``, ``TurnHandle``), never a
second implementation of a turn. A door has a Temporal client's authority only, and starts
turns only for the agents the ``Settings`` it was given name."""
