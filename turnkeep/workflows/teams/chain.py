"""fast-agent's chain, durably: each agent of the sequence in turn, each a child turn."""

from __future__ import annotations

from turnkeep.contract.activity_io import TeamPlan
from turnkeep.contract.messages import CallToolResult, Message, StopReason
from turnkeep.workflows.teams.steps import StepRunner, failed, request


async def run_chain(team: TeamPlan, messages: list[Message], run: StepRunner) -> Message:
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
    tagged = [f"<fastagent:request>{request(messages) or '<no response>'}</fastagent:request>"]
    tagged += [
        f"<fastagent:response agent='{agent.agent}'>{answer.text}</fastagent:response>"
        for agent, answer in zip(team.steps, answers, strict=True)
    ]
    return Message.assistant("\n\n".join(tagged))
