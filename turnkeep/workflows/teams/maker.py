"""MAKER, durably: the worker's answers sampled, each a child turn, until one is k votes
ahead."""

from __future__ import annotations

import json

from pydantic import BaseModel

from turnkeep.contract.activity_io import TeamPlan
from turnkeep.contract.messages import CallToolResult, Message, json_channel
from turnkeep.workflows.teams.steps import StepRunner, answer, failed


class MakerResult(BaseModel):
    """How a maker's vote went (fast-agent's ``MakerResult``), in its answer's ``maker``
    channel."""

    winner: str
    votes: dict[str, int]
    total_samples: int
    discarded_samples: int
    margin: int
    converged: bool


async def run_maker(team: TeamPlan, messages: list[Message], run: StepRunner) -> Message:
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
    winning = answer(answers[chosen])
    winning.channels = {"maker": json_channel(outcome.model_dump())}
    return winning


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
