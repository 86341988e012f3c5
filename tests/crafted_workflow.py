"""What anyone with access to the namespace can do without turnkeep's client: run a workflow of
its own that schedules turnkeep's activities, by name, on the turnkeep workers' task queue,
with requests it made up (``tests.test_activity_checks``). It imports only temporalio and
the activity names, so the sandbox loads it quickly."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

from turnkeep.contract.activity_io import LLM_STEP
from turnkeep.contract.model_io import MODEL_INPUT_QUERY


@workflow.defn
class CraftedWorkflow:
    def __init__(self) -> None:
        self._model_input: dict[str, Any] | None = None

    @workflow.run
    async def run(
        self,
        activity: str,
        task_queue: str,
        request: dict[str, Any],
        model_input: dict[str, Any] | None = None,
    ) -> Any:
        if activity == LLM_STEP:
            # An llm_step reads its input from the workflow that scheduled it: this one answers
            # with whatever it likes, under a digest it computed itself.
            info = workflow.info()
            request = {**request, "workflow_id": info.workflow_id, "run_id": info.run_id}
            self._model_input = model_input
        return await workflow.execute_activity(
            activity,
            request,
            task_queue=task_queue,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )

    @workflow.query(name=MODEL_INPUT_QUERY)
    def model_input(self, call_index: int, start: int) -> dict[str, Any] | None:
        del call_index, start
        return self._model_input
