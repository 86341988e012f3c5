"""A server's elicitation: a person answers its form (accept, with content matching the requested
schema), declines or cancels it."""

from __future__ import annotations

from temporalio import workflow

from turnkeep.contract.activity_io import ToolCallRequest
from turnkeep.contract.approval import Decision, PendingCall
from turnkeep.contract.server_requests import (
    ServerAnswer,
    ServerRequest,
    ServerRequestPlan,
    coerce_content,
    content_problem,
    elicit_answer,
)
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits import server_ask
from turnkeep.workflows.waits.base import Turn
from turnkeep.workflows.waits.server_ask import ServerAsk


class Elicitation(ServerAsk):
    kind = "elicitation"
    takes_content = True

    def problem(self, state: TurnState, decision: Decision, pending: PendingCall) -> str | None:
        problem = super().problem(state, decision, pending)
        if problem is not None:
            return problem
        if decision.decision == "deny":
            if decision.content is not None:
                return "content goes only with an answer (approve), not with a decline or cancel"
            return None
        if decision.cancel:
            return "cancel goes only with deny"
        problem = content_problem(pending.requested_schema, decision.content or {})
        return f"the content does not match the requested schema: {problem}" if problem else None

    def server_answer(
        self, decision: Decision, pending: PendingCall, request: ServerRequest
    ) -> ServerAnswer:
        if decision.decision == "approve":
            content = coerce_content(pending.requested_schema, decision.content or {})
            return elicit_answer(request, "accept", content)
        return elicit_answer(request, "cancel" if decision.cancel else "decline")

    def reason(self, decision: Decision) -> str | None:
        if decision.decision == "approve":
            return decision.reason
        return decision.reason or ("cancelled" if decision.cancel else "declined")

    def after_timeout(self, state: TurnState, pending: PendingCall) -> None:
        request = state.server_asks.pop(pending.call_id)
        # Nobody answering is MCP's cancel ("dismissed without an explicit choice").
        state.server_answers[pending.call_id] = elicit_answer(request, "cancel")


ELICITATION = Elicitation()


async def elicit(
    turn: Turn,
    call: ToolCallRequest,
    wait_id: str,
    request: ServerRequest,
    plan: ServerRequestPlan | None,
) -> ServerAnswer:
    """The answer to a server's elicitation: a person's, or the decline of a server whose
    config does not enable forms."""
    if plan is None or plan.elicitation != "forms":
        refused = request.model_copy(update={"reason": "elicitation is not enabled"})
        server_ask.decline(turn.state, call, wait_id, refused, workflow.now())
        return elicit_answer(request, "decline")
    await ELICITATION.ask(turn, call, wait_id, request)
    return turn.state.server_answers.pop(wait_id)
