"""Reading the limiters of ``limits:``: the turns that wait for capacity, from each running
limiter (a query: a worker must be running)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from turnkeep.contract.limits_io import LIMITER_WORKFLOW_NAME, CapacityWait

_RUNNING = f'WorkflowType = "{LIMITER_WORKFLOW_NAME}" AND ExecutionStatus = "Running"'
_QUERY_TIMEOUT = timedelta(seconds=5)


async def capacity_waits(client: Client) -> list[CapacityWait]:
    """Every turn waiting for a limit's capacity, limit by limit, in grant order. A limiter
    that cannot answer (no worker) is left out."""
    waits: list[CapacityWait] = []
    async for execution in client.list_workflows(_RUNNING):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        try:
            waits += await handle.query(
                "waiting", result_type=list[CapacityWait], rpc_timeout=_QUERY_TIMEOUT
            )
        except (RPCError, WorkflowQueryFailedError):
            continue
    return waits
