"""Reading a turn from its workflow history alone, as ``turnkeep show`` prints it: no worker
has to be running.

The turn's conversation is its latest run's state, which a replay of that run through
``TurnWorkflow`` captures (``turnkeep.client.turn_replay``): a continued-as-new run starts
from the state its predecessor carried, so the latest run alone holds the whole turn.

Timings come from the events of every run: when each activity was scheduled, when its last
attempt started, when it closed; a local activity's from the marker Core records when it ends.
Activities still in flight are filled in from the server's description of the run (attempt,
last failure), which is where Temporal keeps them until they close.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from json import JSONDecodeError
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel, Field, ValidationError
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent, WorkflowExecutionStartedEventAttributes
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    WorkflowSerializationContext,
)
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.children import ChildTurn, read_children
from turnkeep.client.limits import capacity_waits
from turnkeep.client.status import (
    TurnStatus,
    event_attributes,
    event_time,
    failure_of,
    ms_between,
)
from turnkeep.client.turn_replay import replay_turn
from turnkeep.contract.activity_io import CALL_TOOL, LLM_STEP
from turnkeep.contract.limits_io import ASK_CAPACITY, waiting_text
from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.turn_io import TaskPriority, TurnResult
from turnkeep.workflows.agent_tools import child_id
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME


class TurnHistoryError(Exception):
    """The workflow id names no turn whose history can be read."""


class ActivityOutcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    RUNNING = "running"  # an attempt is under way
    SCHEDULED = "scheduled"  # waiting for a worker to take it (or to retry it)
    ABANDONED = "abandoned"  # the run closed (e.g. was terminated) while it was in flight


class ActivityTiming(BaseModel):
    """One activity of the turn (model call, tool call, setup, hook, compaction)."""

    run_id: str
    activity_id: str
    activity: str  # its type: llm_step, call_tool, prepare_turn, list_tools, run_hook, ...
    call_index: int | None = None  # llm_step: the model call's number in the turn (1-based)
    call_id: str | None = None  # call_tool: the tool call it ran
    tool: str | None = None  # call_tool: the tool's name
    outcome: ActivityOutcome
    attempts: int = 0  # the latest attempt's number; 0 while none has been recorded
    scheduled_at: datetime
    started_at: datetime | None = None  # the last attempt's start
    closed_at: datetime | None = None
    # scheduled -> closed: waiting for a worker, retries and the work itself.
    total_ms: float | None = None
    # The last attempt alone: its start -> closed.
    last_attempt_ms: float | None = None
    failure: str | None = None  # why it failed, or the last attempt's failure while retrying
    # Run by the workflow's own worker within its workflow task (a called agent's
    # prepare_turn): its history has a marker, no scheduled or started event. In JSON only
    # when true, so the JSON of every other activity stays as it was.
    local: bool = Field(default=False, exclude_if=lambda local: not local)

    @property
    def label(self) -> str:
        if self.call_index is not None:
            return f"llm #{self.call_index}"
        if self.tool is not None:
            return f"tool {self.tool} · {self.call_id}"
        return f"{self.activity} (local)" if self.local else self.activity


class RunInfo(BaseModel):
    """One run of the turn's workflow; a long turn continues as new over several."""

    run_id: str
    started_at: datetime
    closed_at: datetime | None = None
    events: int


class TurnView(BaseModel):
    """A turn as its history records it: what ``turnkeep show`` prints."""

    workflow_id: str
    run_id: str  # the latest run, the one whose state is shown
    status: TurnStatus
    started_at: datetime  # the first run's start
    closed_at: datetime | None = None
    agent: str | None = None
    model: str | None = None
    # Its task priority and tenant (``TurnPlan``), when other than normal and none.
    priority: TaskPriority | None = None
    tenant: str | None = None
    # The turn's input messages, when the loop never started and they are all there is to show
    # (otherwise they begin ``result.messages``).
    prompt: list[Message] = Field(default_factory=list)
    # The turn as it stands (the same TurnResult the workflow returns or a query answers);
    # None when it never got past preparing (e.g. an unknown agent).
    result: TurnResult | None = None
    # None while the loop still runs (result.stop_reason then only holds a default).
    stop_reason: StopReason | None = None
    failure: str | None = None  # why the run failed, or who terminated it
    activities: list[ActivityTiming] = Field(default_factory=list)
    runs: list[RunInfo] = Field(default_factory=list)
    # The child turns it started (its team's steps, the agents it called as tools), in order.
    children: list[ChildTurn] = Field(default_factory=list)
    # Anything that makes the view less than exact (a history the code could not replay).
    warnings: list[str] = Field(default_factory=list)
    # A running turn whose model call waits for its limit (`limits:`): why, as the turn's
    # current details say (`waiting for capacity: gpt-4.1 58/60 rpm`). In JSON only when set.
    waiting_for_capacity: str | None = Field(default=None, exclude_if=lambda v: v is None)

    @property
    def in_flight(self) -> list[ActivityTiming]:
        waiting = (ActivityOutcome.RUNNING, ActivityOutcome.SCHEDULED)
        return [a for a in self.activities if a.outcome in waiting]


async def read_turn(client: Client, workflow_id: str, run_id: str | None = None) -> TurnView:
    """The turn ``workflow_id`` as its history has it; works with no worker running.

    Without ``run_id`` this is the latest run with that id; with one, the turn that run
    belongs to, followed to its latest run if it continued as new."""
    return await view_histories(client, await _run_histories(client, workflow_id, run_id))


async def view_histories(client: Client, histories: Sequence[WorkflowHistory]) -> TurnView:
    """The turn recorded by ``histories``: the runs of one turn, first to latest. ``client``
    decodes payloads and, for a turn still running, describes what is in flight."""
    latest = histories[-1]
    view = TurnView(
        workflow_id=latest.workflow_id,
        run_id=latest.run_id,
        status=_status(latest.events[-1]),
        started_at=event_time(histories[0].events[0].event_time),
        closed_at=_closed_at(latest),
        runs=[_run_info(history) for history in histories],
    )
    for history in histories:
        view.activities.extend(await _activities(client, history))
        view.children.extend(await read_children(client, history.workflow_id, history.events))
    if view.status == TurnStatus.RUNNING:
        await _add_pending(client, view)
        view.waiting_for_capacity = await _capacity_wait(client, view)
    view.failure = await _failure(client, latest)
    await _add_state(client, view, latest)
    _link_calls(view)
    return view


async def _capacity_wait(client: Client, view: TurnView) -> str | None:
    """Why a running turn's model call waits for capacity, when its last step asked a limiter
    and its call has not been scheduled since: as the limiter says (a query: a worker must be
    running; without one, only that it waits)."""
    last = view.activities[-1] if view.activities else None
    if last is None or last.activity != ASK_CAPACITY or last.outcome != ActivityOutcome.COMPLETED:
        return None
    for wait in await capacity_waits(client):
        if wait.workflow_id == view.workflow_id:
            return waiting_text(wait.limit, wait.why)
    return "waiting for capacity"


def _link_calls(view: TurnView) -> None:
    """The whole id of the tool call each agent called as a tool answers (a child's id holds
    only the start of a long one)."""
    if view.result is None:
        return
    calls = [c for m in view.result.messages for c in (m.tool_calls or {})]
    for child in view.children:
        if child.step is not None and child.call_id is not None:
            ids = {child_id(view.workflow_id, child.step, c): c for c in calls}
            child.call_id = ids.get(child.workflow_id, child.call_id)


# -- fetching -------------------------------------------------------------------------------


async def _run_histories(
    client: Client, workflow_id: str, run_id: str | None
) -> list[WorkflowHistory]:
    """Every run of the turn, first to latest: forward along continued-as-new links from the
    given run, then back along them to the turn's first run."""
    chain = [await _fetch(client, workflow_id, run_id)]
    while (successor := _continued_to(chain[-1])) is not None:
        chain.append(await _fetch(client, workflow_id, successor))
    while predecessor := _started(chain[0]).continued_execution_run_id:
        chain.insert(0, await _fetch(client, workflow_id, predecessor))
    return chain


async def _fetch(client: Client, workflow_id: str, run_id: str | None) -> WorkflowHistory:
    try:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            run = f" (run {run_id})" if run_id else ""
            raise TurnHistoryError(
                f"no turn with workflow id {workflow_id!r}{run} in namespace "
                f"{client.namespace!r}: check the id, and the server and namespace it ran on"
            ) from None
        raise
    started = history.events[0] if history.events else None
    if started is None or started.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        raise TurnHistoryError(f"the history of {workflow_id!r} is empty or incomplete")
    kind = started.workflow_execution_started_event_attributes.workflow_type.name
    if kind != WORKFLOW_NAME:
        raise TurnHistoryError(f"{workflow_id!r} is a {kind} workflow, not a turn")
    return history


def _started(history: WorkflowHistory) -> WorkflowExecutionStartedEventAttributes:
    return history.events[0].workflow_execution_started_event_attributes


def _continued_to(history: WorkflowHistory) -> str | None:
    last = history.events[-1]
    if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
        return None
    return str(last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id)


async def _add_state(client: Client, view: TurnView, history: WorkflowHistory) -> None:
    replayed = await replay_turn(client, history)
    state = replayed.state
    turn = replayed.turn
    if turn is not None:
        view.agent = turn.agent
        if state is None:
            view.prompt = list(turn.messages)
    if state is not None:
        view.agent = state.plan.agent
        view.model = state.plan.model
        if state.plan.priority != "normal":
            view.priority = state.plan.priority
        view.tenant = state.plan.fairness_key
        view.result = state.result()
        view.stop_reason = state.stop_reason
    if replayed.failure is None:
        return
    problem = f"this history does not replay against the current workflow code ({replayed.failure})"
    if view.status == TurnStatus.COMPLETED:
        # The result the run recorded stands whatever the code does now.
        view.result = await _recorded_result(client, history)
        view.stop_reason = view.result.stop_reason
        view.warnings.append(f"{problem}; the result shown is the one the turn recorded")
    else:
        view.warnings.append(f"{problem}; what is shown is as far as replay got")


async def _recorded_result(client: Client, history: WorkflowHistory) -> TurnResult:
    completed = history.events[-1].workflow_execution_completed_event_attributes
    converter = _workflow_converter(client, history.workflow_id)
    [result] = await converter.decode(completed.result.payloads, [TurnResult])
    return TurnResult.model_validate(result)


# -- status and times -----------------------------------------------------------------------

_CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: TurnStatus.COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: TurnStatus.CANCELLED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: TurnStatus.FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: TurnStatus.TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: TurnStatus.TIMED_OUT,
}


def _status(last: HistoryEvent) -> TurnStatus:
    return _CLOSED.get(last.event_type, TurnStatus.RUNNING)


def _closes(event: HistoryEvent) -> bool:
    return (
        event.event_type in _CLOSED
        or event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    )


def _closed_at(history: WorkflowHistory) -> datetime | None:
    last = history.events[-1]
    return event_time(last.event_time) if _closes(last) else None


def _run_info(history: WorkflowHistory) -> RunInfo:
    return RunInfo(
        run_id=history.run_id,
        started_at=event_time(history.events[0].event_time),
        closed_at=_closed_at(history),
        events=len(history.events),
    )


async def _failure(client: Client, history: WorkflowHistory) -> str | None:
    """Why the run ended, if it did not end as a turn does (completed or cancelled)."""
    last = history.events[-1]
    if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        failure = last.workflow_execution_failed_event_attributes.failure
        return await failure_of(_workflow_converter(client, history.workflow_id), failure)
    if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
        attributes = last.workflow_execution_terminated_event_attributes
        by = f" (by {attributes.identity})" if attributes.identity else ""
        return (attributes.reason or "no reason given") + by
    if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
        return "the run timed out (its workflow execution or run timeout passed)"
    return None


# -- activities -----------------------------------------------------------------------------


async def _activities(client: Client, history: WorkflowHistory) -> list[ActivityTiming]:
    """The run's activities in the order it scheduled them, timed by their events."""
    timings: dict[int, ActivityTiming] = {}  # by the scheduled event's id (a local one's marker)
    local: dict[str, int] = {}  # a local activity's id -> its first marker's event id
    for event in history.events:
        kind = event.event_type
        at = event_time(event.event_time)
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            timing = ActivityTiming(
                run_id=history.run_id,
                activity_id=attributes.activity_id,
                activity=attributes.activity_type.name,
                outcome=ActivityOutcome.SCHEDULED,
                scheduled_at=at,
            )
            await _label(client, history.workflow_id, event, timing)
            timings[event.event_id] = timing
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            timing = timings[started.scheduled_event_id]
            timing.started_at = at
            timing.attempts = started.attempt
            timing.outcome = ActivityOutcome.RUNNING
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED:
            # The workflow stops waiting for it here (it does not wait for the worker to
            # confirm), so for the turn this is where the activity ended.
            cancel = event.activity_task_cancel_requested_event_attributes
            _close(timings[cancel.scheduled_event_id], ActivityOutcome.CANCELLED, at)
        elif kind == EventType.EVENT_TYPE_MARKER_RECORDED:
            await _local_activity(client, history, event, timings, local)
        elif (closed := _activity_close(event)) is not None:
            outcome, scheduled_event_id, failure = closed
            timing = timings[scheduled_event_id]
            _close(timing, outcome, at)
            if failure is not None and failure.ByteSize():
                converter = _activity_converter(client, history.workflow_id, timing)
                timing.failure = await failure_of(converter, failure)
    run_closed = _closed_at(history)
    for timing in timings.values():
        if run_closed is not None and timing.closed_at is None:
            _close(timing, ActivityOutcome.ABANDONED, run_closed)
    return list(timings.values())


# The marker Temporal's Core SDK records for each local activity attempt that ends.
LOCAL_ACTIVITY_MARKER = "core_local_activity"


class _MarkerTime(BaseModel):
    """A protobuf timestamp as Core writes it in JSON."""

    seconds: int = 0
    nanos: int = 0

    def at(self) -> datetime:
        return event_time(Timestamp(seconds=self.seconds, nanos=self.nanos))


class _LocalActivityMarker(BaseModel):
    """The marker's ``data`` detail: Core's ``LocalActivityMarkerData``, as JSON. Core writes
    it itself (no codec touches it); the activity's result and failure are elsewhere."""

    activity_id: str
    activity_type: str
    attempt: int = 0
    # The workflow's time when the activity was scheduled plus the last attempt's run time.
    complete_time: _MarkerTime | None = None
    # The worker's clock when the first attempt was scheduled.
    original_schedule_time: _MarkerTime | None = None
    # Set when the attempt failed and the workflow waits on a timer to schedule the next.
    backoff: Any = None


async def _local_activity(
    client: Client,
    history: WorkflowHistory,
    event: HistoryEvent,
    timings: dict[int, ActivityTiming],
    local: dict[str, int],
) -> None:
    """A local activity's attempt from its marker: the activity it is, how it ended and when.
    Retried after a backoff, it is the same activity under the same id with a new marker."""
    marker = event.marker_recorded_event_attributes
    if marker.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in marker.details:
        return  # some other marker (a patch, a side effect)
    payloads = marker.details["data"].payloads
    try:
        data = _LocalActivityMarker.model_validate_json(payloads[0].data)
    except (IndexError, JSONDecodeError, ValidationError):
        return  # a marker of some other shape: nothing to list
    at = event_time(event.event_time)
    first = local.setdefault(data.activity_id, event.event_id)
    timing = timings.get(first)
    if timing is None:
        scheduled = data.original_schedule_time
        timing = timings[first] = ActivityTiming(
            run_id=history.run_id,
            activity_id=data.activity_id,
            activity=data.activity_type,
            outcome=ActivityOutcome.SCHEDULED,
            scheduled_at=scheduled.at() if scheduled else at,
            local=True,
        )
    timing.attempts = data.attempt
    failure = marker.failure if marker.HasField("failure") else None
    if failure is not None:
        converter = _activity_converter(client, history.workflow_id, timing)
        timing.failure = await failure_of(converter, failure)
    if data.backoff is not None:
        timing.outcome = ActivityOutcome.SCHEDULED  # waiting on its timer to be retried
        return
    _close(timing, _local_outcome(failure), data.complete_time.at() if data.complete_time else at)
    # Scheduled by the worker's clock, completed by the workflow's: on a quick one the two
    # can disagree by more than it took.
    timing.total_ms = max(timing.total_ms or 0.0, 0.0)


def _local_outcome(failure: Failure | None) -> ActivityOutcome:
    if failure is None:
        return ActivityOutcome.COMPLETED
    kind = failure.WhichOneof("failure_info")
    if kind == "timeout_failure_info":
        return ActivityOutcome.TIMED_OUT
    if kind == "canceled_failure_info":
        return ActivityOutcome.CANCELLED
    return ActivityOutcome.FAILED


def _close(timing: ActivityTiming, outcome: ActivityOutcome, at: datetime) -> None:
    if timing.closed_at is not None and outcome == ActivityOutcome.CANCELLED:
        return  # a cancel confirmed after its request: for the turn it ended at the request
    timing.outcome = outcome
    timing.closed_at = at
    timing.total_ms = ms_between(timing.scheduled_at, at)
    timing.last_attempt_ms = ms_between(timing.started_at, at)


_ACTIVITY_CLOSED = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ActivityOutcome.COMPLETED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ActivityOutcome.FAILED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ActivityOutcome.TIMED_OUT,
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: ActivityOutcome.CANCELLED,
}


def _activity_close(event: HistoryEvent) -> tuple[ActivityOutcome, int, Failure | None] | None:
    """How an activity's closing event closed it, which activity, and its failure if any."""
    outcome = _ACTIVITY_CLOSED.get(event.event_type)
    if outcome is None:
        return None
    attributes = event_attributes(event)
    return outcome, attributes.scheduled_event_id, getattr(attributes, "failure", None)


def _workflow_converter(client: Client, workflow_id: str) -> DataConverter:
    """The converter as a client of the workflow uses it (the context a codec may key on)."""
    context = WorkflowSerializationContext(namespace=client.namespace, workflow_id=workflow_id)
    return client.data_converter.with_context(context)


def _activity_converter(client: Client, workflow_id: str, timing: ActivityTiming) -> DataConverter:
    """The converter as the activity's worker used it (the context a codec may key on)."""
    return client.data_converter.with_context(
        ActivitySerializationContext(
            namespace=client.namespace,
            activity_id=timing.activity_id,
            activity_type=timing.activity,
            activity_task_queue=None,
            workflow_id=workflow_id,
            workflow_type=WORKFLOW_NAME,
            is_local=timing.local,
        )
    )


class _ModelCallInput(BaseModel):
    """The part of ``llm_step``'s input that says which call it is. Only that part: inputs
    recorded by earlier versions of turnkeep (a whole ``LlmRequest``) have it too."""

    call_index: int


class _ToolCallInput(BaseModel):
    """The part of ``call_tool``'s input (``ToolCallRequest``) that says which call it is."""

    call_id: str
    name: str


async def _label(
    client: Client, workflow_id: str, event: HistoryEvent, timing: ActivityTiming
) -> None:
    """Which model call or tool call an activity is, from its own input."""
    if timing.activity not in (LLM_STEP, CALL_TOOL):
        return
    payloads = event.activity_task_scheduled_event_attributes.input.payloads
    converter = _activity_converter(client, workflow_id, timing)
    try:
        if timing.activity == LLM_STEP:
            [step] = await converter.decode(payloads, [_ModelCallInput])
            timing.call_index = step.call_index
        else:
            [call] = await converter.decode(payloads, [_ToolCallInput])
            timing.call_id, timing.tool = call.call_id, call.name
    except ValidationError:
        pass  # an input of some other shape: the activity is listed without a label


async def _add_pending(client: Client, view: TurnView) -> None:
    """Attempts and failures of activities still in flight, which only the server's
    description of the run has until they close."""
    handle = client.get_workflow_handle(view.workflow_id, run_id=view.run_id)
    described = await handle.describe()
    pending = {p.activity_id: p for p in described.raw_description.pending_activities}
    for timing in view.activities:
        mine = timing.run_id == view.run_id and not timing.local  # the server has no local ones
        info = pending.get(timing.activity_id) if mine else None
        if info is None or timing.closed_at is not None:
            continue
        timing.attempts = info.attempt
        waiting = info.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
        timing.outcome = ActivityOutcome.SCHEDULED if waiting else ActivityOutcome.RUNNING
        if info.HasField("last_started_time"):
            timing.started_at = event_time(info.last_started_time)
        if info.HasField("last_failure"):
            converter = _activity_converter(client, view.workflow_id, timing)
            timing.failure = await failure_of(converter, info.last_failure)
