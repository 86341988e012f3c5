"""fast-agent's evaluator-optimizer, durably: the generator answers and the evaluator rates
the answer (structured output), refining until good enough, each a child turn."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field, ValidationError

from turnkeep.contract.activity_io import TeamPlan
from turnkeep.contract.messages import Message
from turnkeep.workflows.teams.steps import StepRunner, answer, failed, request


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


async def run_evaluator_optimizer(
    team: TeamPlan, messages: list[Message], run: StepRunner
) -> Message:
    """fast-agent's evaluator-optimizer: the generator answers, the evaluator rates the answer
    (structured output); below ``min_rating`` and while it asks for improvement, the generator
    refines with the feedback, at most ``max_refinements`` times. The answer is the best rated
    (the last, once the evaluator wants no improvement)."""
    generator, evaluator = team.steps
    asked = request(messages)
    step = 1
    call = await run(generator, messages, step, generator.agent)
    if call.result.is_error:
        return failed(f"the generator ({generator.agent}) failed", call.result)
    response = best = call.result
    best_rating = QualityRating.POOR
    refinements = 0
    while True:
        step += 1
        prompt = _evaluation_prompt(team, asked, response.text, refinements)
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
        prompt = _refinement_prompt(team, asked, response.text, evaluation, refinements)
        call = await run(generator, [Message.user(prompt)], step, generator.agent)
        if call.result.is_error:
            return failed(f"the generator ({generator.agent}) failed", call.result)
        response = call.result
        refinements += 1
    return answer(best)


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
