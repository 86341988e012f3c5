"""fast-agent's workflow agents, durably: a ``chain`` or a ``parallel`` agent's turn runs other
agents' turns as its steps, each a child workflow with a history of its own, and answers with
what fast-agent's ``ChainAgent`` and ``ParallelAgent`` would. A worker that dies between steps
loses none that finished: they are in the turn's history, as each child's result."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from turnkeep.workflows.activity_io import AgentTool, TeamPlan
from turnkeep.workflows.agent_tools import AgentCall
from turnkeep.workflows.messages import CallToolResult, Message, StopReason, TextContent

# Runs one step: an agent on messages, as the child turn with the given step and name.
StepRunner = Callable[[AgentTool, list[Message], int, str], Awaitable[AgentCall]]


async def run_team(team: TeamPlan, messages: list[Message], run: StepRunner) -> Message:
    """The workflow agent's answer to ``messages`` (the turn's new messages)."""
    if team.kind == "chain":
        return await _chain(team, messages, run)
    return await _parallel(team, messages, run)


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
