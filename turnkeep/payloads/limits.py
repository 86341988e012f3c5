"""Temporal's limit on one payload, kept when payload storage is off: a turn whose result would
pass it fails with a message saying so, instead of retrying its last workflow task for ever."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payloads
from temporalio.converter import ExternalStorage
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from turnkeep.contract.activity_io import PAYLOAD_LIMIT_BYTES
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

RESULT_TOO_LARGE = "TurnResultTooLarge"


def result_size_guard(storage: ExternalStorage | None) -> list[Interceptor]:
    # With external storage a large result is stored, not refused: nothing to guard.
    return [] if storage is not None else [_ResultSizeGuard()]


class _ResultSizeGuard(Interceptor):
    """Without external storage: a turn whose result is over Temporal's payload limit fails,
    with an error saying so, instead of retrying its last workflow task for ever."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        del input
        return _ResultSizeInbound


class _ResultSizeInbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        result = await super().execute_workflow(input)
        # The application's workflows on the same worker are none of turnkeep's business.
        if workflow.info().workflow_type != WORKFLOW_NAME:
            return result
        # The bytes the SDK is about to send; the conversion is deterministic, so replay agrees.
        size = Payloads(payloads=workflow.payload_converter().to_payloads([result])).ByteSize()
        if size > PAYLOAD_LIMIT_BYTES - 1024:
            raise ApplicationError(
                f"The turn finished, but its result is {size / 1_000_000:.2f} MB, over "
                f"Temporal's {PAYLOAD_LIMIT_BYTES / 1_048_576:.0f} MB payload limit, so it cannot "
                "be recorded. Turn on payload_storage in the worker's turnkeep.yaml (driver: "
                "local or s3) to keep large payloads out of the history, or shorten turns "
                "(max_iterations, max_tool_result_bytes).",
                {"result_bytes": size, "limit_bytes": PAYLOAD_LIMIT_BYTES},
                type=RESULT_TOO_LARGE,
                non_retryable=True,
            )
        return result
