"""fast-agent's parallel, durably: the fan-out agents at once, each a child turn, then the
fan-in agent over their answers."""

from __future__ import annotations

import asyncio

from turnkeep.contract.activity_io import TeamPlan
from turnkeep.contract.messages import Message
from turnkeep.workflows.teams.steps import StepRunner, answer, failed, request


async def run_parallel(team: TeamPlan, messages: list[Message], run: StepRunner) -> Message:
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
    asked = request(messages)
    if team.include_request and asked:
        parts += [
            "The following request was sent to the agents:",
            f"<fastagent:request>\n{asked}\n</fastagent:request>",
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
    return answer(call.result)
