"""The turn's data contract: the pydantic models that cross the boundaries between a client, the
workflows and their activities (a turn's input and result, messages, activity requests and
outcomes, a session's records, approvals and a server's requests), and the pure checks on them.
Pydantic and the standard library, besides temporalio's ``CancelledError`` (which a cancelled
turn's error extends) and ``jsonschema`` (imported only when a client-side tool's result is
checked): so workflow code, activities and clients all import it."""
