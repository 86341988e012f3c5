"""Evaluations from history: many recorded turns replayed at once on another model, agent or
system prompt (as ``turnkeep.replay_turn`` replays one), each pair compared and scored by an
optional judge. An evaluation is a workflow (``EvaluationWorkflow``): durable, resumable, and
readable while it runs.

The same request gets the same workflow id (``evaluation_id``), so starting it again attaches
to the evaluation already running, or finished, instead of replaying every turn again.
"""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDConflictPolicy

from turnkeep.client.queries import query_retrying
from turnkeep.client.status import describe_failure
from turnkeep.contract.evaluation_io import (
    EVALUATION_WORKFLOW,
    EvaluatedTurn,
    EvaluationInput,
    EvaluationReport,
)
from turnkeep.contract.turn_io import DEFAULT_TASK_QUEUE
from turnkeep.support.describe import described
from turnkeep.workflows import visibility


class EvaluationError(ValueError):
    """An evaluation that cannot start (a request out of bounds) or that failed (refused by
    the worker: an unknown judge or agent, a query the server rejects)."""


class EvaluationHandle:
    """An evaluation in flight or done."""

    def __init__(self, client: Client, workflow_id: str) -> None:
        self.client = client
        self.workflow_id = workflow_id
        self.handle: WorkflowHandle[Any, EvaluationReport] = client.get_workflow_handle(
            workflow_id, result_type=EvaluationReport
        )

    async def progress(self) -> EvaluationReport:
        """The rows so far and the totals (``finished`` once every turn is done)."""
        report: EvaluationReport = await query_retrying(
            self.handle, "report", result_type=EvaluationReport
        )
        return report

    async def report(self) -> EvaluationReport:
        """Wait for the evaluation to finish and return its report; ``EvaluationError`` with
        the worker's reason when it failed."""
        try:
            return await self.handle.result()
        except WorkflowFailureError as err:
            raise EvaluationError(
                f"evaluation {self.workflow_id!r} failed: {describe_failure(err.cause)}"
            ) from None


def evaluation_input(**fields: Any) -> EvaluationInput:
    """The evaluation's input (``EvaluationInput``'s fields), checked: ``EvaluationError``
    saying what is out of bounds."""
    try:
        return EvaluationInput(**fields)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        raise EvaluationError(f"cannot evaluate: {problems}") from None


def evaluation_id(request: EvaluationInput) -> str:
    """The workflow id of an evaluation: the same for the same request, so running the same
    command again attaches to it."""
    digest = hashlib.sha256(request.model_dump_json().encode()).hexdigest()
    return f"eval-{digest[:16]}"


async def evaluate(
    client: Client,
    query: str = "",
    *,
    model: str | None = None,
    agent: str | None = None,
    instruction: str | None = None,
    judge: str | None = None,
    limit: int = 100,
    concurrency: int = 4,
    workflow_id: str | None = None,
    task_queue: str | None = None,
    fresh: bool = False,
) -> EvaluationHandle:
    """Replay the completed turns that the visibility ``query`` matches (at most ``limit``,
    newest first; ``concurrency`` at a time) on ``model``, as ``agent`` or with ``instruction``
    (as ``turnkeep.replay_turn`` takes them), compare each with its recording, and score each
    pair with ``judge``: an agent of the worker's config, or a ``package.module:function`` its
    ``judges`` list. Returns at once; ``await handle.report()`` for the outcome.

    The workflow id is ``workflow_id``, else ``evaluation_id`` of the request: an evaluation
    running or completed under it is attached to, not started again (``fresh``: start a new
    run even over a completed one). ``task_queue``: the worker's (``turnkeep`` by default)."""
    request = evaluation_input(
        query=query,
        model=model,
        agent=agent,
        instruction=instruction,
        judge=judge,
        limit=limit,
        concurrency=concurrency,
    )
    return await start_evaluation(
        client, request, workflow_id=workflow_id, task_queue=task_queue, fresh=fresh
    )


async def start_evaluation(
    client: Client,
    request: EvaluationInput,
    *,
    workflow_id: str | None = None,
    task_queue: str | None = None,
    fresh: bool = False,
) -> EvaluationHandle:
    """``evaluate`` with its input made already (``evaluation_input``)."""
    id = workflow_id or evaluation_id(request)
    existing = await _status(client, id)
    if existing == WorkflowExecutionStatus.RUNNING or (
        existing == WorkflowExecutionStatus.COMPLETED and not fresh
    ):
        return EvaluationHandle(client, id)
    await client.start_workflow(
        EVALUATION_WORKFLOW,
        request,
        id=id,
        task_queue=task_queue or DEFAULT_TASK_QUEUE,
        result_type=EvaluationReport,
        static_summary=visibility.clip(f"evaluate {request.query or 'all turns'}"),
        # Two starters racing for the same id get the same evaluation.
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return EvaluationHandle(client, id)


def get_evaluation(client: Client, workflow_id: str) -> EvaluationHandle:
    """An evaluation started earlier, by its workflow id."""
    return EvaluationHandle(client, workflow_id)


async def _status(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    found = await described(client.get_workflow_handle(workflow_id))
    if found is not None and found.workflow_type != EVALUATION_WORKFLOW:
        raise EvaluationError(
            f"{workflow_id!r} is a {found.workflow_type} workflow, not an evaluation"
        )
    return None if found is None else found.status


# The report's columns: a row's fields, in order.
COLUMNS = list(EvaluatedTurn.model_fields)


def write_report(report: EvaluationReport, path: Path) -> None:
    """Write ``report`` to ``path``: CSV (one row per turn) for a ``.csv`` file, else JSON
    (the whole report, totals included)."""
    if path.suffix.lower() == ".csv":
        with path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.DictWriter(out, fieldnames=COLUMNS)
            writer.writeheader()
            for row in report.rows:
                writer.writerow(row.model_dump(mode="json"))
        return
    path.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
