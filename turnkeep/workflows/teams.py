"""fast-agent's workflow agents, durably: a ``chain`` or a ``parallel`` agent's turn runs other
agents' turns as its steps, each a child workflow with a history of its own, and answers with
what fast-agent's ``ChainAgent`` and ``ParallelAgent`` would. A worker that dies between steps
loses none that finished: they are in the turn's history, as each child's result."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, Field, ValidationError

from turnkeep.workflows.activity_io import AgentTool, TeamPlan
from turnkeep.workflows.agent_tools import AgentCall
from turnkeep.workflows.messages import (
    CallToolResult,
    Message,
    StopReason,
    TextContent,
    json_channel,
)


class StepRunner(Protocol):
    """Runs one step: an agent on messages, as the child turn with the given step and name,
    asking it for JSON of ``structured_output`` when given."""

    def __call__(
        self,
        tool: AgentTool,
        messages: list[Message],
        step: int,
        name: str,
        structured_output: dict[str, Any] | None = None,
    ) -> Awaitable[AgentCall]: ...


# Asks the workflow agent's own model (a router's) about messages, for JSON of this schema.
ModelAsker = Callable[[list[Message], dict[str, Any]], Awaitable[Message]]

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


async def run_team(
    team: TeamPlan, messages: list[Message], run: StepRunner, ask: ModelAsker
) -> Message:
    """The workflow agent's answer to ``messages`` (the turn's new messages)."""
    if team.kind == "chain":
        return await _chain(team, messages, run)
    if team.kind == "router":
        return await _router(team, messages, run, ask)
    if team.kind == "evaluator_optimizer":
        return await _evaluator_optimizer(team, messages, run)
    if team.kind == "maker":
        return await _maker(team, messages, run)
    return await _parallel(team, messages, run)


async def _router(
    team: TeamPlan, messages: list[Message], run: StepRunner, ask: ModelAsker
) -> Message:
    """The router's model picks one of its agents for the last message (with one agent, no
    model call), and that agent answers the turn's messages. An answer naming no agent of the
    router's is the router's answer, as in fast-agent."""
    by_name = {agent.agent: agent for agent in team.steps}
    if len(team.steps) == 1:
        chosen = team.steps[0]
    else:
        answer = await ask(messages[-1:], ROUTING_SCHEMA)
        if answer.stop_reason == StopReason.ERROR:
            return answer
        try:
            route = RoutingResponse.model_validate_json(answer.text)
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
    return _answer(call.result)


async def _chain(team: TeamPlan, messages: list[Message], run: StepRunner) -> Message:
    """Each agent of the sequence in turn. Plain: the first gets the turn's messages and each
    next one the previous answer; the last answer is the chain's. Cumulative: each gets the
    turn's messages and every earlier answer, and the chain answers with all of them, tagged."""
    answers: list[CallToolResult] = []
    inputs = messages
    for step, agent in enumerate(team.steps, start=1):
        call = await run(agent, inputs, step, agent.agent)
        if call.result.is_error:
            return failed(f"step {step} of the chain ({agent.agent}) failed", call.result)
        answers.append(call.result)
        answer = Message(role="user", content=call.result.content)
        inputs = [*inputs, answer] if team.cumulative else [answer]
    if not team.cumulative:
        return Message(
            role="assistant", content=answers[-1].content, stop_reason=StopReason.END_TURN
        )
    tagged = [f"<fastagent:request>{_request(messages) or '<no response>'}</fastagent:request>"]
    tagged += [
        f"<fastagent:response agent='{agent.agent}'>{answer.text}</fastagent:response>"
        for agent, answer in zip(team.steps, answers, strict=True)
    ]
    return Message.assistant("\n\n".join(tagged))


async def _parallel(team: TeamPlan, messages: list[Message], run: StepRunner) -> Message:
    """Every fan-out agent at once on the turn's messages; their answers, tagged (with the
    request unless ``include_request`` is off), go to the fan-in agent, whose answer is the
    parallel's; without one, the tagged answers are. A branch that fails fails the parallel,
    once every branch has ended: the others' answers stay in their own histories."""
    calls = await asyncio.gather(
        *(run(agent, messages, 1, f"{i}-{agent.agent}") for i, agent in enumerate(team.steps))
    )
    for agent, call in zip(team.steps, calls, strict=True):
        if call.result.is_error:
            return failed(f"the parallel's branch {agent.agent} failed", call.result)
    parts: list[str] = []
    request = _request(messages)
    if team.include_request and request:
        parts += [
            "The following request was sent to the agents:",
            f"<fastagent:request>\n{request}\n</fastagent:request>",
        ]
    parts += [
        f'<fastagent:response agent="{agent.agent}">\n{call.result.text}\n</fastagent:response>'
        for agent, call in zip(team.steps, calls, strict=True)
    ]
    aggregated = "\n\n".join(parts)
    if team.fan_in is None:
        return Message.assistant(aggregated)
    call = await run(team.fan_in, [Message.user(aggregated)], 2, team.fan_in.agent)
    if call.result.is_error:
        return failed(f"the parallel's fan-in ({team.fan_in.agent}) failed", call.result)
    return _answer(call.result)


class QualityRating(StrEnum):
    """fast-agent's ratings, worst first."""

    POOR = "POOR"
    FAIR = "FAIR"
    GOOD = "GOOD"
    EXCELLENT = "EXCELLENT"

    @property
    def rank(self) -> int:
        return list(QualityRating).index(self)


class EvaluationResult(BaseModel):
    """fast-agent's structured evaluation."""

    rating: QualityRating = Field(description="Quality rating of the response")
    feedback: str = Field(description="Specific feedback and suggestions for improvement")
    needs_improvement: bool = Field(description="Whether the output needs further improvement")
    focus_areas: list[str] = Field(
        default_factory=list, description="Specific areas to focus on in next iteration"
    )


EVALUATION_SCHEMA = EvaluationResult.model_json_schema()
_UNPARSED = EvaluationResult(
    rating=QualityRating.POOR,
    feedback="Failed to parse evaluation",
    needs_improvement=True,
    focus_areas=["Improve overall quality"],
)
_EVALUATOR = "You are an expert evaluator for content quality."


async def _evaluator_optimizer(team: TeamPlan, messages: list[Message], run: StepRunner) -> Message:
    """fast-agent's evaluator-optimizer: the generator answers, the evaluator rates the answer
    (structured output); below ``min_rating`` and while it asks for improvement, the generator
    refines with the feedback, at most ``max_refinements`` times. The answer is the best rated
    (the last, once the evaluator wants no improvement)."""
    generator, evaluator = team.steps
    request = _request(messages)
    step = 1
    call = await run(generator, messages, step, generator.agent)
    if call.result.is_error:
        return failed(f"the generator ({generator.agent}) failed", call.result)
    response = best = call.result
    best_rating = QualityRating.POOR
    refinements = 0
    while True:
        step += 1
        prompt = _evaluation_prompt(team, request, response.text, refinements)
        rated = await run(
            evaluator, [Message.user(prompt)], step, evaluator.agent, EVALUATION_SCHEMA
        )
        if rated.result.is_error:
            return failed(f"the evaluator ({evaluator.agent}) failed", rated.result)
        try:
            evaluation = EvaluationResult.model_validate_json(rated.result.text)
        except ValidationError:
            evaluation = _UNPARSED
        if evaluation.rating.rank > best_rating.rank:
            best, best_rating = response, evaluation.rating
        if not evaluation.needs_improvement:
            best = response
            break
        if evaluation.rating.rank >= QualityRating(team.min_rating).rank:
            break
        if refinements >= team.max_refinements:
            break
        step += 1
        prompt = _refinement_prompt(team, request, response.text, evaluation, refinements)
        call = await run(generator, [Message.user(prompt)], step, generator.agent)
        if call.result.is_error:
            return failed(f"the generator ({generator.agent}) failed", call.result)
        response = call.result
        refinements += 1
    return _answer(best)


def _evaluation_prompt(team: TeamPlan, request: str, response: str, iteration: int) -> str:
    return f"""
{team.refinement_instruction or _EVALUATOR}

Your task is to evaluate a response against the user's original request.
Evaluate the response for iteration {iteration + 1} and provide feedback on its quality and areas for improvement.

```
<fastagent:data>
    <fastagent:request>
{request}
    </fastagent:request>

    <fastagent:response>
{response}
    </fastagent:response>
</fastagent:data>
```
"""  # noqa: E501


def _refinement_prompt(
    team: TeamPlan, request: str, response: str, feedback: EvaluationResult, iteration: int
) -> str:
    focus = "\n".join(f"      * {area}" for area in feedback.focus_areas) or "None specified"
    return f"""
You are tasked with improving your previous response.
{team.refinement_instruction or _EVALUATOR}
This is iteration {iteration + 1} of the refinement process.

Your goal is to address all feedback points while maintaining accuracy and relevance to the original request.

```

<fastagent:feedback>
    <request>
{request}
    </request>
    <previous-response>
{response}
    </previous-response>
    <rating>{feedback.rating.name}</rating>
    <details>{feedback.feedback}</details>
    <focus-areas>
{focus}
    </focus-areas>
</fastagent:feedback>

<fastagent:instruction>
Create an improved version of the response that:
1. Directly addresses each point in the feedback
2. Focuses on the specific areas mentioned for improvement
3. Maintains all the strengths of the original response
4. Remains accurate and relevant to the original request

Provide your complete improved response without explanations or commentary.
</fastagent:instruction>

```

"""  # noqa: E501


class MakerResult(BaseModel):
    """How a maker's vote went (fast-agent's ``MakerResult``), in its answer's ``maker``
    channel."""

    winner: str
    votes: dict[str, int]
    total_samples: int
    discarded_samples: int
    margin: int
    converged: bool


async def _maker(team: TeamPlan, messages: list[Message], run: StepRunner) -> Message:
    """MAKER's first-to-ahead-by-k vote: the worker answers the turn's messages again and
    again, each answer a fresh child turn; answers over ``red_flag_max_length`` are discarded;
    the first answer ``k`` votes ahead of every other wins. Past ``max_samples``, the most
    voted does."""
    [worker] = team.steps
    votes: dict[str, int] = {}
    answers: dict[str, CallToolResult] = {}
    samples = discarded = 0
    winner: str | None = None
    while samples < team.max_samples and winner is None:
        samples += 1
        call = await run(worker, messages, samples, worker.agent)
        if call.result.is_error:
            return failed(f"sample {samples} of the maker's worker ({worker.agent})", call.result)
        text = call.result.text
        if team.red_flag_max_length is not None and len(text) > team.red_flag_max_length:
            discarded += 1
            continue
        key = _vote_key(text, team.match_strategy)
        votes[key] = votes.get(key, 0) + 1
        answers.setdefault(key, call.result)
        winner = _ahead_by(votes, team.k)
    if not votes:
        return failed(
            "the maker's vote",
            CallToolResult.error(
                f"All {samples} samples were red-flagged. Consider relaxing red-flag criteria."
            ),
        )
    converged = winner is not None
    chosen = winner if winner is not None else max(votes, key=lambda k: votes[k])
    ranked = sorted(votes.values(), reverse=True)
    outcome = MakerResult(
        winner=chosen,
        votes=votes,
        total_samples=samples,
        discarded_samples=discarded,
        margin=ranked[0] - (ranked[1] if len(ranked) > 1 else 0),
        converged=converged,
    )
    answer = _answer(answers[chosen])
    answer.channels = {"maker": json_channel(outcome.model_dump())}
    return answer


def _vote_key(text: str, strategy: str) -> str:
    if strategy == "normalized":
        return " ".join(text.casefold().split())
    if strategy == "structured":
        try:
            return json.dumps(json.loads(text), sort_keys=True)
        except ValueError:
            return text
    return text


def _ahead_by(votes: dict[str, int], k: int) -> str | None:
    """The answer ``k`` votes ahead of the runner-up, if one is."""
    ranked = sorted(votes.items(), key=lambda item: item[1], reverse=True)
    runner_up = ranked[1][1] if len(ranked) > 1 else 0
    return ranked[0][0] if ranked[0][1] - runner_up >= k else None


def failed(what: str, result: CallToolResult) -> Message:
    """The workflow agent's answer when a step failed: an ``error`` message saying which."""
    text = f"{what}: {result.text}"
    return Message(
        role="assistant",
        content=[TextContent(text=text)],
        channels={"error": [TextContent(text=text)]},
        stop_reason=StopReason.ERROR,
    )


def _answer(result: CallToolResult) -> Message:
    return Message(role="assistant", content=result.content, stop_reason=StopReason.END_TURN)


def _request(messages: list[Message]) -> str:
    return messages[-1].text if messages else ""
