"""fast-agent's iterative planner (its ``orchestrator`` and ``iterative_planner`` agents),
durably: the planner's model names the next step, its tasks run as child turns, until the
objective is met; then the planner answers from the results."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

from turnkeep.contract.activity_io import AgentTool, TeamPlan
from turnkeep.contract.messages import Message, StopReason
from turnkeep.workflows.teams.steps import ModelAsker, StepRunner, request

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


async def run_planner(
    team: TeamPlan, messages: list[Message], run: StepRunner, ask: ModelAsker
) -> Message:
    """fast-agent's iterative planner: the planner's model names the next step (tasks for its
    agents, structured output) until it says the objective is complete, or names an agent it
    does not have, or ``plan_iterations`` steps have run; a step's tasks run at once across
    agents, one after another for each agent, each a child turn told the objective and the
    results so far. The planner's model then answers from every result."""
    objective = request(messages)
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
