"""A function judge for evaluations run by worker processes (``turnkeep worker`` imports it by
the path its config lists under ``judges``)."""

from __future__ import annotations

import asyncio

from turnkeep.contract.evaluation_io import EvaluationPair, Judgement


async def slow_judge(pair: EvaluationPair) -> Judgement:
    """Takes a moment per pair, so a batch is still running when a test kills its worker."""
    await asyncio.sleep(0.5)
    return Judgement(score=1.0 if pair.source_final == pair.replay_final else 0.0, reason="slow")
