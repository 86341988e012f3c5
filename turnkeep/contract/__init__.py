"""The turn's data contract: the pydantic models that cross the boundaries between a client, the
workflows and their activities (a turn's input and result, messages, activity requests and
outcomes, a session's records, approvals and a server's requests), and the pure checks on them.
Pydantic and the standard library only, so workflow code, activities and clients all import it."""
