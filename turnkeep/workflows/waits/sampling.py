"""A server's sampling request, answered by a model call of the turn (on the server's configured
model or the agent's), after a person's approval when its config wants one: then it waits,
approved or denied, nothing else."""

from __future__ import annotations

from temporalio import workflow

from turnkeep.contract.activity_io import ToolCallRequest
from turnkeep.contract.messages import StopReason
from turnkeep.contract.model_io import LlmRequest, MessageJson
from turnkeep.contract.server_requests import (
    ServerAnswer,
    ServerRequest,
    ServerRequestPlan,
    sample_answer,
    sample_refusal,
)
from turnkeep.workflows import actions, pending_calls
from turnkeep.workflows.waits import server_ask
from turnkeep.workflows.waits.base import Turn
from turnkeep.workflows.waits.server_ask import ServerAsk


class Sampling(ServerAsk):
    kind = "sampling"


SAMPLING = Sampling()


async def sample(
    turn: Turn,
    call: ToolCallRequest,
    wait_id: str,
    request: ServerRequest,
    plan: ServerRequestPlan | None,
) -> ServerAnswer:
    """A server's sampling request as a model call of the turn, counted in the turn's usage."""
    state = turn.state
    if plan is None or not plan.sampling or request.sampling is None:
        refused = request.model_copy(update={"reason": "sampling is not enabled"})
        server_ask.decline(state, call, wait_id, refused, workflow.now())
        return sample_refusal(request, "sampling is not enabled for this server")
    if plan.sampling_approval:
        await SAMPLING.ask(turn, call, wait_id, request)
        record = pending_calls.last_record(state, wait_id)
        if record is None or not record.approved:
            return sample_refusal(request, "sampling was not approved")
    asked = request.sampling
    limit = state.plan.max_tokens
    max_tokens = asked.max_tokens
    if limit is not None:
        max_tokens = min(max_tokens or limit, limit)
    model = plan.sampling_model or state.plan.model
    state.model_calls += 1
    llm = LlmRequest(
        agent=state.plan.agent,
        model=model,
        call_index=state.model_calls,
        instruction=asked.system_prompt,
        messages=asked.messages,
        tools=[],
        temperature=asked.temperature,
        max_tokens=max_tokens,
    )
    turn.requests_in_flight.sampling_inputs[llm.call_index] = llm
    try:
        answer = await actions.call_model(llm, state.plan, MessageJson())
    finally:
        del turn.requests_in_flight.sampling_inputs[llm.call_index]
    state.count_usage(answer, model)
    if answer.stop_reason == StopReason.ERROR:
        return sample_refusal(request, answer.text)
    return sample_answer(request, answer, model)
