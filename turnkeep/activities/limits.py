"""The activities of limits (``limits:``): a turn's way to a limiter (``ask_capacity``, a
signal-with-start with the worker's client), and a limiter's read of its values from the config
of the worker running it (``limit_values``): a limiter never takes its values from a client."""

from __future__ import annotations

from temporalio import activity
from temporalio.common import WorkflowIDConflictPolicy

from turnkeep.config.settings import LimitSettings
from turnkeep.contract.limits_io import (
    ASK_CAPACITY,
    ASK_CAPACITY_SIGNAL,
    LIMIT_VALUES,
    LIMITER_WORKFLOW_NAME,
    CapacityRequest,
    LimiterStart,
    LimitValues,
    limiter_id,
)
from turnkeep.errors import config_error, known, require_workflow


class LimitActivities:
    def __init__(self, limits: dict[str, LimitSettings]) -> None:
        self._limits = limits

    @activity.defn(name=LIMIT_VALUES)
    async def limit_values(self, name: str) -> LimitValues:
        """The values of limit ``name`` in this worker's config, for its limiter only."""
        info = activity.info()
        if info.workflow_type != LIMITER_WORKFLOW_NAME or info.workflow_id != limiter_id(name):
            raise config_error(
                "NotALimiter", "Activity 'limit_values' runs only in the limiter of that limit."
            )
        return LimitValues.model_validate(self._limit(name).model_dump())

    @activity.defn(name=ASK_CAPACITY)
    async def ask_capacity(self, request: CapacityRequest) -> None:
        """Ask ``request.limit``'s limiter for a model call's capacity, starting the limiter if
        none runs. The answer comes to the turn by signal: the grant, or why it waits."""
        require_workflow()
        info = activity.info()
        # Grants go to the turn that asks, never to one a request names.
        if (request.workflow_id, request.run_id) != (info.workflow_id, info.workflow_run_id):
            raise config_error(
                "NotThisTurn", "A turn asks for capacity only for itself (workflow and run id)."
            )
        self._limit(request.limit)
        # A signal, not an update: Temporal keeps only a few updates in flight per workflow,
        # and a fleet's turns ask one limiter at once; signals queue without bound, and the
        # limiter takes all that wait in one workflow task. Asking twice (an attempt run
        # again) is harmless: the ledger queues a request once, by its key.
        await activity.client().start_workflow(
            LIMITER_WORKFLOW_NAME,
            LimiterStart(),
            id=limiter_id(request.limit),
            # On the turn's queue: a worker with turnkeep's workflows polls it.
            task_queue=info.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal=ASK_CAPACITY_SIGNAL,
            start_signal_args=[request],
        )

    def _limit(self, name: str) -> LimitSettings:
        found = self._limits.get(name)
        if found is None:
            raise config_error(
                "UnknownLimit",
                f"Limit {name!r} is not in this worker's `limits:` (known: {known(self._limits)}).",
            )
        return found
