"""Recorded turns as a regression suite: ``assert_replays`` replays the turns a visibility query
matches (an evaluation from history, ``turnkeep.client.evaluations``) on the worker of your
test, and fails the test, naming each turn, when a replay failed, answered otherwise than its
recording (``same_final``) or scored below ``min_score`` by the judge.

Replays answer every tool call from the recording, so the suite runs no tool; with a model
that needs no network (``playback``, ``passthrough``, a ``FakeModel``) it runs offline."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import Client

from turnkeep.client.evaluations import evaluation_input, start_evaluation
from turnkeep.contract.evaluation_io import EvaluatedTurn, EvaluationReport


class EvaluationFailedError(AssertionError):
    """Replays that did not pass, one line each; ``report`` is the whole evaluation."""

    def __init__(self, report: EvaluationReport, failures: list[str]) -> None:
        self.report = report
        self.failures = failures
        lines = "\n".join(f"- {line}" for line in failures)
        super().__init__(
            f"{len(failures)} of {report.summary.turns} replay(s) did not pass "
            f"(evaluation {report.evaluation_id}):\n{lines}"
        )


async def assert_replays(
    client: Client,
    query: str = "",
    *,
    task_queue: str,
    min_score: float | None = None,
    same_final: bool = False,
    at_least: int = 1,
    **options: Any,
) -> EvaluationReport:
    """Replay the completed turns ``query`` matches on the worker polling ``task_queue`` (a
    ``Harness``'s), as ``turnkeep.evaluate`` does with ``options`` (``model``, ``agent``,
    ``instruction``, ``judge``, ``limit``, ``concurrency``), and return the report; raise
    ``EvaluationFailedError`` naming every turn whose replay failed, whose final answer differs
    from the recording's (with ``same_final``), whose judge failed, or whose score is below
    ``min_score``; and when fewer than ``at_least`` turns matched (a query that matches
    nothing passes no test). Each call is a new evaluation: nothing is attached to."""
    handle = await start_evaluation(
        client,
        evaluation_input(query=query, **options),
        workflow_id=f"eval-test-{uuid.uuid4().hex[:12]}",
        task_queue=task_queue,
    )
    report = await handle.report()
    failures = [
        why for row in report.rows if (why := _failure(row, min_score, same_final)) is not None
    ]
    if report.summary.turns < at_least:
        failures.append(f"the query matched {report.summary.turns} turn(s), not {at_least}")
    if failures:
        raise EvaluationFailedError(report, failures)
    return report


def _failure(row: EvaluatedTurn, min_score: float | None, same_final: bool) -> str | None:
    turn = f"{row.source} (replay {row.replay})"
    if row.status == "failed":
        return f"{turn}: the replay failed: {row.error}"
    if same_final and not row.same_final:
        return f"{turn}: answered {row.replay_final!r}, recorded {row.source_final!r}"
    if min_score is not None:
        if row.judge_error is not None:
            return f"{turn}: the judge failed: {row.judge_error}"
        if row.score is None or row.score < min_score:
            return f"{turn}: scored {row.score} < {min_score}: {row.reason}"
    return None
