"""What a tool call's server asked during a run, settled by the workflow: what the run declined
at once is recorded, and what it could not answer gets an answer (a person's, for an
elicitation; a model call's, for sampling), with which the call runs again."""

from __future__ import annotations

from temporalio import workflow

from turnkeep.contract.activity_io import ToolCallOutcome, ToolCallRequest
from turnkeep.contract.messages import CallToolResult
from turnkeep.contract.server_requests import MAX_SERVER_REQUESTS, wait_id
from turnkeep.workflows.waits import elicitation, sampling, server_ask
from turnkeep.workflows.waits.base import Turn


async def answer(
    turn: Turn, call: ToolCallRequest, outcome: ToolCallOutcome
) -> ToolCallRequest | CallToolResult | None:
    """``call`` to run again with the answer to what its server asked in ``outcome``; an error
    result once the server asked too often; None when it asked nothing that waits."""
    state, in_flight = turn.state, turn.requests_in_flight
    now = workflow.now()
    for declined in outcome.declined:
        # A re-run declines the same request again: it is recorded once.
        if (call.call_id, declined.digest) not in in_flight.declined:
            in_flight.declined.add((call.call_id, declined.digest))
            id = wait_id(call.call_id, declined.kind, in_flight.next_number(call.call_id))
            server_ask.decline(state, call, id, declined, now)
    request = outcome.needs_input
    if request is None:
        return None
    if len(call.answers) >= MAX_SERVER_REQUESTS:
        return CallToolResult.error(
            f"Error: the server made more than {MAX_SERVER_REQUESTS} requests in this call"
        )
    plan = call.server_plan(state.plan)
    id = wait_id(call.call_id, request.kind, in_flight.next_number(call.call_id))
    if request.kind == "elicitation":
        answered = await elicitation.elicit(turn, call, id, request, plan)
    else:
        answered = await sampling.sample(turn, call, id, request, plan)
    return call.model_copy(update={"answers": [*call.answers, answered]})
