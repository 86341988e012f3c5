"""fast-agent's workflow agents, durably: a ``chain``, ``parallel``, ``router``,
``evaluator_optimizer``, ``maker``, ``orchestrator`` or ``iterative_planner`` agent's turn runs
other agents' turns as its steps, each a child workflow with a history of its own, and answers
with what fast-agent's workflow agent of that kind would. A worker that dies between steps
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


# Asks the workflow agent's own model (a router's, a planner's) about messages, for JSON of
# this schema (None: text).
ModelAsker = Callable[[list[Message], dict[str, Any] | None], Awaitable[Message]]

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
    if team.kind in ("orchestrator", "iterative_planner"):
        return await _planner(team, messages, run, ask)
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


# fast-agent's planner prompts (its IterativePlanner runs both `orchestrator` and
# `iterative_planner` agents).
PLANNER_INSTRUCTION = """
You are an expert planner, able to Orchestrate complex tasks by breaking them down in to
manageable steps, and delegating tasks to Agents.

You work iteratively - given an Objective, you consider the current state of the plan,
decide the next step towards the goal. You document those steps and create clear instructions
for execution by the Agents, being specific about what you need to know to assess task completion. 

NOTE: A 'Planning Step' has a description, and a list of tasks that can be delegated 
and executed in parallel.

Agents have a 'description' describing their primary function, and a set of 'skills' that
represent Tools they can use in completing their function.

The following Agents are available to you:

{{agents}}

You must specify the Agent name precisely when generating a Planning Step. 

"""  # noqa: W291
ORCHESTRATOR_INSTRUCTION = """
    You are an expert planner. Given an objective task and a list of Agents
    (which are collections of capabilities), your job is to break down the objective
    into a series of steps, which can be performed by these agents.
    """
_PLANNING_PROMPT = """

```
<fastagent:data>
    <fastagent:progress>
{plan_result}
    </fastagent:progress>

    <fastagent:status>
{plan_status}
{iterations_info}
    </fastagent:status>
</fastagent:data>
```

The overall objective is:

```
<fastagent:objective>
    {objective}
</fastagent:objective>
```

Produce the next step in the plan to complete the Objective. 

Consider the previous steps and results, and decide what needs to be done next.

Set "is_complete" to true when ANY of these conditions are met:
1. The objective has been achieved in full or substantively
2. The remaining work is minor or trivial compared to what's been accomplished
3. The plan has gathered sufficient information to answer the original request
4. The plan has no feasible way of completing the objective.

Only set is_complete to `true` if there are no outstanding tasks. 

Be decisive - avoid excessive planning steps that add little value. It's better to complete a plan early than to continue with marginal improvements. 

Focus on the meeting the core intent of the objective.

"""  # noqa: E501, W291
_DELEGATED_TASK = """
You are a component in an orchestrated workflow to achieve an objective.

The overall objective is:

```
<fastagent:objective>
    {objective}
</fastagent:objective>
```

Previous context in achieving the objective is below:

```
<fastagent:context>
    {context}
</fastagent:context>
```

Your job is to accomplish the "task" specified in `<fastagent:task>`. The overall objective and
previous context is supplied to inform your approach.

```
<fastagent:task>
   {task}
</fastagent:task>
```

Provide a direct, concise response on completion that makes it simple to assess the status of
the overall plan.
"""
_PLAN_RESULT = """
The below shows the results of running a plan to meet the specified objective.

```
<fastagent:plan-results>
{plan_result}
</fastagent:plan-results>
```

The plan was stopped because {termination_reason}.

Provide a summary of the tasks completed and their outcomes to complete the Objective.
Use markdown formatting.

If the plan was marked as incomplete but the maximum number of iterations was reached,
make sure to state clearly what was accomplished and what remains to be done.


Complete the plan by providing an appropriate answer for the original objective. Provide a Mermaid diagram
(in code fences) showing the plan steps and their relationships, if applicable. Do not use parentheses in labels.
"""  # noqa: E501


class AgentTask(BaseModel):
    """An individual task that can be accomplished by an Agent."""

    description: str = Field(description="Description of the task")
    agent: str = Field(
        description="Name of Agent from given list of agents that the LLM has access to for "
        "this task"
    )


class PlanningStep(BaseModel):
    """fast-agent's structured next step of an iterative plan."""

    description: str = Field(description="Description of the step")
    tasks: list[AgentTask] = Field(
        default_factory=list, description="Subtasks that can be executed in parallel"
    )
    is_complete: bool = Field(description="Whether the overall plan objective is complete")


PLANNING_SCHEMA = PlanningStep.model_json_schema()


class _TaskResult(BaseModel):
    description: str
    agent: str
    result: str


class _StepResult(BaseModel):
    description: str
    tasks: list[_TaskResult]


def planner_instruction(agents: list[AgentTool], kind: str, instruction: str | None) -> str:
    """A planner's system prompt, as fast-agent builds it: its instruction (by default
    fast-agent's for its kind) with each agent's card where ``{{agents}}`` stands. An
    instruction without the placeholder gets the cards after it: a planner that does not know
    its agents' names can only plan steps it is then refused."""
    default = PLANNER_INSTRUCTION if kind == "iterative_planner" else ORCHESTRATOR_INSTRUCTION
    chosen = instruction or default
    cards = "\n".join(_agent_card(agent) for agent in agents)
    if "{{agents}}" in chosen:
        return chosen.replace("{{agents}}", cards)
    return f"{chosen}\n\nThe following Agents are available to you:\n\n{cards}\n"


def _agent_card(agent: AgentTool) -> str:
    lines = [f'<fastagent:agent name="{agent.agent}">']
    if agent.spec.description:
        lines.append(f"  <fastagent:description>{agent.spec.description}</fastagent:description>")
    lines.append("</fastagent:agent>")
    return "\n".join(lines)


async def _planner(
    team: TeamPlan, messages: list[Message], run: StepRunner, ask: ModelAsker
) -> Message:
    """fast-agent's iterative planner: the planner's model names the next step (tasks for its
    agents, structured output) until it says the objective is complete, or names an agent it
    does not have, or ``plan_iterations`` steps have run; a step's tasks run at once across
    agents, one after another for each agent, each a child turn told the objective and the
    results so far. The planner's model then answers from every result."""
    objective = _request(messages)
    by_name = {agent.agent: agent for agent in team.steps}
    steps: list[_StepResult] = []
    complete = False
    while True:
        answer = await ask(
            [Message.user(_planning_prompt(team, objective, steps))], PLANNING_SCHEMA
        )
        try:
            if answer.stop_reason == StopReason.ERROR:
                raise ValueError(answer.text)
            step = PlanningStep.model_validate_json(answer.text)
        except ValueError:
            stopped = "Failed to generate plan, terminating early"
            break
        if step.is_complete:
            complete, stopped = True, "Plan completed successfully"
            break
        unknown = [task.agent for task in step.tasks if task.agent not in by_name]
        if unknown:
            stopped = f"Invalid agent names found ({', '.join(unknown)}), terminating plan"
            break
        context = _plan_progress(objective, steps, complete=False)
        steps.append(await _run_step(step, len(steps) + 1, objective, context, by_name, run))
        if 0 < team.plan_iterations <= len(steps):
            stopped = (
                f"Reached maximum number of iterations ({team.plan_iterations}), terminating plan"
            )
            break
    progress = _plan_progress(objective, steps, complete=complete)
    prompt = _PLAN_RESULT.format(plan_result=progress, termination_reason=stopped)
    final = await ask([Message.user(prompt)], None)
    if final.stop_reason == StopReason.ERROR:
        return final
    return Message.assistant(final.text or "No final message generated")


async def _run_step(
    step: PlanningStep,
    number: int,
    objective: str,
    context: str,
    by_name: dict[str, AgentTool],
    run: StepRunner,
) -> _StepResult:
    """One planned step: each agent's tasks one after another, the agents at once."""
    by_agent: dict[str, list[tuple[int, AgentTask]]] = {}
    for index, task in enumerate(step.tasks, start=1):
        by_agent.setdefault(task.agent, []).append((index, task))

    async def agent_tasks(name: str, tasks: list[tuple[int, AgentTask]]) -> list[_TaskResult]:
        results = []
        for index, task in tasks:
            prompt = _DELEGATED_TASK.format(
                objective=objective, task=task.description, context=context
            )
            call = await run(by_name[name], [Message.user(prompt)], number, f"{index}-{name}")
            text = call.result.text or "<missing response>"
            results.append(
                _TaskResult(
                    description=task.description,
                    agent=name,
                    result=f"ERROR: {text}" if call.result.is_error else text,
                )
            )
        return results

    done = await asyncio.gather(*(agent_tasks(name, tasks) for name, tasks in by_agent.items()))
    return _StepResult(description=step.description, tasks=[r for rs in done for r in rs])


def _planning_prompt(team: TeamPlan, objective: str, steps: list[_StepResult]) -> str:
    status = "Plan Status: In Progress" if steps else "Plan Status: Not Started"
    if team.plan_iterations > 0:
        left = team.plan_iterations - len(steps)
        iterations = f"Planning Budget: {left} of {team.plan_iterations} iterations remaining"
    else:
        iterations = "Iterating until objective is met."
    return _PLANNING_PROMPT.format(
        objective=objective,
        plan_result=_plan_progress(objective, steps, complete=False),
        plan_status=status,
        iterations_info=iterations,
    )


def _tag(name: str, content: str | None = None, attributes: dict[str, str] | None = None) -> str:
    """fast-agent's ``format_fastagent_tag``."""
    attrs = "".join(f' {k}="{v}"' for k, v in (attributes or {}).items())
    if not content:
        return f"<fastagent:{name}{attrs} />"
    return f"<fastagent:{name}{attrs}>{content}</fastagent:{name}>"


def _plan_progress(objective: str, steps: list[_StepResult], *, complete: bool) -> str:
    """fast-agent's ``format_plan_result``: the objective, each step's task results, and the
    status, as the planner and the agents are shown them."""
    status = "Complete" if complete else "In Progress" if steps else "Not Started"
    if steps:
        body = "\n" + "\n".join(_step_progress(step) for step in steps) + "\n"
    else:
        body = "No steps executed yet"
    return _tag(
        "progress",
        f"{_tag('objective', objective)}\n<fastagent:steps>{body}</fastagent:steps>\n"
        f"<fastagent:status>{status}</fastagent:status>\n",
    )


def _step_progress(step: _StepResult) -> str:
    tasks = "\n".join(
        _tag(
            "task-result",
            f"\n<fastagent:description>{task.description}</fastagent:description>\n"
            f"<fastagent:result>{task.result}</fastagent:result>\n",
            {
                "description": task.description[:50] + "..."
                if len(task.description) > 50
                else task.description
            },
        )
        for task in step.tasks
    )
    summary = _summary(step)
    return _tag(
        "step-result",
        f"<fastagent:description>{step.description}</fastagent:description>\n"
        f"<fastagent:summary>{summary}</fastagent:summary>\n"
        f"<fastagent:task-results>\n{tasks}\n</fastagent:task-results>\n",
    )


def _summary(step: _StepResult) -> str:
    """fast-agent's ``format_step_result_text``, a step's summary."""
    tasks = "\n".join(f"  - Task: {t.description}\nResult: {t.result}" for t in step.tasks)
    return f"Step: {step.description}\nStep Subtasks:\n{tasks}"


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
