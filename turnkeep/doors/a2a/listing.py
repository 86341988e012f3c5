"""``ListTasks`` from Temporal's visibility: an agent's tasks are its A2A sessions' turns,
found by a query (their context, their state, how recently their status changed), a page at a
time with Temporal's own page token; each task is then read as ``GetTask`` reads it."""

from __future__ import annotations

import base64
import binascii
import re

from a2a.types.a2a_pb2 import ListTasksRequest, ListTasksResponse, TaskState
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from a2a.utils.task import apply_history_length
from temporalio.client import Client

from turnkeep.contract.turn_io import WORKFLOW_NAME as TURN_WORKFLOW_NAME
from turnkeep.doors.a2a.tasks import (
    TaskRef,
    checked_context_id,
    session_id_for,
    snapshot,
    task_id_for,
)
from turnkeep.workflows.visibility import STATUS, TurnStatus

DEFAULT_PAGE_SIZE = 50  # A2A's default
MAX_PAGE_SIZE = 100  # and its most
_TURN_ID = re.compile(r"a2a:(?P<agent>[^:]+):(?P<context>[A-Za-z0-9._-]+)/turn-(?P<turn>[0-9]+)")

# A task's state as a condition on its turn's workflow. A running turn waits for input when it
# says so (its `TurnkeepStatus`); a completed workflow is a completed task, as `GetTask` says.
_RUNNING = "ExecutionStatus = 'Running'"
_WAITING = f"{STATUS.name} = '{TurnStatus.AWAITING_APPROVAL.value}'"
_STATES: dict[int, str | None] = {
    TaskState.TASK_STATE_UNSPECIFIED: "",
    TaskState.TASK_STATE_WORKING: f"{_RUNNING} AND ({STATUS.name} IS NULL OR NOT {_WAITING})",
    TaskState.TASK_STATE_INPUT_REQUIRED: f"{_RUNNING} AND {_WAITING}",
    TaskState.TASK_STATE_COMPLETED: "ExecutionStatus = 'Completed'",
    TaskState.TASK_STATE_CANCELED: "ExecutionStatus = 'Canceled'",
    TaskState.TASK_STATE_FAILED: "ExecutionStatus IN ('Failed', 'Terminated', 'TimedOut')",
    # No turn is ever these (a queued turn has no workflow yet to list).
    TaskState.TASK_STATE_SUBMITTED: None,
    TaskState.TASK_STATE_REJECTED: None,
    TaskState.TASK_STATE_AUTH_REQUIRED: None,
}


async def list_tasks(client: Client, agent: str, params: ListTasksRequest) -> ListTasksResponse:
    """A page of the agent's tasks, most recent first, as ``params`` filters them."""
    size = params.page_size if params.HasField("page_size") else DEFAULT_PAGE_SIZE
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise InvalidParamsError(message=f"pageSize must be 1 to {MAX_PAGE_SIZE}")
    if params.HasField("history_length") and params.history_length < 0:
        raise InvalidParamsError(message="historyLength must not be negative")
    query = _query(agent, params)
    if query is None:
        return ListTasksResponse(page_size=size)
    total = (await client.count_workflows(query)).count
    found = client.list_workflows(query, page_size=size, next_page_token=_token(params.page_token))
    await found.fetch_next_page()
    response = ListTasksResponse(page_size=size, total_size=total)
    for execution in found.current_page or []:
        ref = _ref(agent, execution.id)
        if ref is None:  # a turn's own child turn (an agent called as a tool)
            continue
        try:
            task = await snapshot(client, agent, ref)
        except TaskNotFoundError:  # gone since it was listed
            continue
        if not params.include_artifacts:
            task.ClearField("artifacts")
        response.tasks.append(apply_history_length(task, params))
    token = found.next_page_token
    response.next_page_token = base64.urlsafe_b64encode(token).decode() if token else ""
    return response


def _query(agent: str, params: ListTasksRequest) -> str | None:
    """The visibility query of the tasks ``params`` asks for; None when none can match."""
    state = _STATES.get(params.status)
    if state is None:
        return None
    conditions = [f"WorkflowType = '{TURN_WORKFLOW_NAME}'"]
    if params.context_id:
        # A session's own turns are its children (an agent tool's turns are theirs).
        session = session_id_for(agent, checked_context_id(params.context_id))
        conditions.append(f"ParentWorkflowId = {_quoted(session)}")
    else:
        conditions.append(f"WorkflowId STARTS_WITH {_quoted(session_id_for(agent, ''))}")
    if state:
        conditions.append(f"({state})")
    if params.HasField("status_timestamp_after"):
        after = params.status_timestamp_after.ToJsonString()
        conditions.append(f"(CloseTime >= '{after}' OR StartTime >= '{after}')")
    return " AND ".join(conditions)


def _ref(agent: str, workflow_id: str) -> TaskRef | None:
    match = _TURN_ID.fullmatch(workflow_id)
    if match is None or match["agent"] != agent:
        return None
    turn = int(match["turn"])
    return TaskRef(
        task_id=task_id_for(match["context"], turn), context_id=match["context"], turn=turn
    )


def _token(page_token: str) -> bytes | None:
    if not page_token:
        return None
    try:
        return base64.urlsafe_b64decode(page_token.encode())
    except (binascii.Error, ValueError):
        raise InvalidParamsError(message="invalid pageToken: pass one ListTasks gave") from None


def _quoted(value: str) -> str:
    """A string literal of Temporal's list filter (SQL-like: quotes and backslashes escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
