"""fast-agent's workflow agents, durably: a ``chain``, ``parallel``, ``router``,
``evaluator_optimizer``, ``maker``, ``orchestrator`` or ``iterative_planner`` agent's turn runs
other agents' turns as its steps, each a child workflow with a history of its own, and answers
with what fast-agent's workflow agent of that kind would (one module each in this package). A
worker that dies between steps loses none that finished: they are in the turn's history, as
each child's result."""

from __future__ import annotations

from turnkeep.contract.activity_io import TeamPlan
from turnkeep.contract.messages import Message
from turnkeep.workflows.teams.chain import run_chain
from turnkeep.workflows.teams.evaluator import run_evaluator_optimizer
from turnkeep.workflows.teams.maker import run_maker
from turnkeep.workflows.teams.parallel import run_parallel
from turnkeep.workflows.teams.planner import run_planner
from turnkeep.workflows.teams.router import run_router
from turnkeep.workflows.teams.steps import ModelAsker, StepRunner


async def run_team(
    team: TeamPlan, messages: list[Message], run: StepRunner, ask: ModelAsker
) -> Message:
    """The workflow agent's answer to ``messages`` (the turn's new messages)."""
    if team.kind == "chain":
        return await run_chain(team, messages, run)
    if team.kind == "router":
        return await run_router(team, messages, run, ask)
    if team.kind == "evaluator_optimizer":
        return await run_evaluator_optimizer(team, messages, run)
    if team.kind == "maker":
        return await run_maker(team, messages, run)
    if team.kind in ("orchestrator", "iterative_planner"):
        return await run_planner(team, messages, run, ask)
    return await run_parallel(team, messages, run)
