"""A workflow's description when there is such a workflow: ``None``, not an error, for an id
the namespace has never seen (every other failure of the call is raised)."""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowExecutionDescription, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode


async def described(handle: WorkflowHandle[Any, Any]) -> WorkflowExecutionDescription | None:
    try:
        return await handle.describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return None
