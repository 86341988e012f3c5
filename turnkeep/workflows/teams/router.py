"""fast-agent's router, durably: the router's model picks one of its agents by fast-agent's
routing prompt and structured answer, and that agent's child turn answers."""

from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

from turnkeep.contract.activity_io import AgentTool, TeamPlan
from turnkeep.contract.messages import Message, StopReason
from turnkeep.workflows.teams.steps import ModelAsker, StepRunner, answer, failed

# fast-agent's router prompts.
ROUTING_SYSTEM_INSTRUCTION = """
You are a highly accurate request router that directs incoming requests to the most appropriate agent.
Analyze each request and determine which specialized agent would be best suited to handle it based on their capabilities.
Follow these guidelines:
- Carefully match the request's needs with each agent's capabilities and description
- Select the single most appropriate agent for the request
- Provide your confidence level (high, medium, low) and brief reasoning for your selection
"""  # noqa: E501
ROUTING_AGENT_INSTRUCTION = """
Select from the following agents to handle the request:
<fastagent:agents>
[
{context}
]
</fastagent:agents>

You must respond with the 'name' of one of the agents listed above.
"""


class RoutingResponse(BaseModel):
    """fast-agent's structured routing answer."""

    agent: str
    confidence: str
    reasoning: str | None = None


ROUTING_SCHEMA = RoutingResponse.model_json_schema()


def routing_instruction(agents: list[AgentTool], template: str | None = None) -> str:
    """A router's system prompt, as fast-agent builds it: its routing rules and each agent's
    card (name and description). ``template`` (the router's own instruction, with
    ``{context}`` where the cards go) replaces fast-agent's list of agents."""
    cards = ",\n".join(
        json.dumps(
            {k: v for k, v in {"name": a.agent, "description": a.spec.description}.items() if v},
            separators=(",", ":"),
        )
        for a in agents
    )
    chosen = template if template and "{context}" in template else ROUTING_AGENT_INSTRUCTION
    return ROUTING_SYSTEM_INSTRUCTION + "\n\n" + chosen.replace("{context}", cards)


async def run_router(
    team: TeamPlan, messages: list[Message], run: StepRunner, ask: ModelAsker
) -> Message:
    """The router's model picks one of its agents for the last message (with one agent, no
    model call), and that agent answers the turn's messages. An answer naming no agent of the
    router's is the router's answer, as in fast-agent."""
    by_name = {agent.agent: agent for agent in team.steps}
    if len(team.steps) == 1:
        chosen = team.steps[0]
    else:
        routing = await ask(messages[-1:], ROUTING_SCHEMA)
        if routing.stop_reason == StopReason.ERROR:
            return routing
        try:
            route = RoutingResponse.model_validate_json(routing.text)
        except ValidationError:
            return Message.assistant("No routing response received from LLM")
        if route.agent not in by_name:
            return Message.assistant(
                f"A response was received, but the agent {route.agent} was not known to the Router"
            )
        chosen = by_name[route.agent]
    call = await run(chosen, messages, 1, chosen.agent)
    if call.result.is_error:
        return failed(f"the router's agent {chosen.agent} failed", call.result)
    return answer(call.result)
