"""turnkeep's front doors: thin layers over the client API that serve agents to callers who do
not hold a Temporal client (HTTP, MCP, A2A, a web page)."""
