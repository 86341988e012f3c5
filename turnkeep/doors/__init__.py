"""Front doors: agents served to callers that hold no Temporal client (A2A, HTTP...), each a
thin layer over the client API (``start_turn``, ``open_session``, ``stream``, ``decide``)."""
