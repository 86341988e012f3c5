"""The front doors: ways in to turnkeep's agents for callers that hold no Temporal client (an
HTTP gateway, and what is built over it). Each is a thin layer over the client API
(``turnkeep.client``), never a second implementation of a turn."""
