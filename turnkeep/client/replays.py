"""Counterfactual replay: run a finished turn's loop again on another model, agent or system
prompt, with its tools answered from what the turn recorded (the documentation's *Time
travel*).

A replay is a turn (``TurnWorkflow``, started with ``TurnInput.replay_of``): durable, listed and
shown like any other, marked by the ``TurnkeepReplayOf`` search attribute and its summary. Its
worker reads the source's input and recorded tool results from the source's own history; the
client names the source, nothing more. ``ReplayHandle.report()`` sets the two turns side by
side (``ReplayReport``).
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.converter import WorkflowSerializationContext
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.replay_io import call_key, recorded_calls
from turnkeep.contract.turn_io import (
    DEFAULT_TASK_QUEUE,
    ReplayOf,
    TurnInput,
    TurnResult,
    agent_task_queue,
)
from turnkeep.observability.search_attributes import present_search_attributes
from turnkeep.workflows import visibility
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME


class ReplayError(ValueError):
    """A replay that cannot start or be reported on: an unknown turn, one still running, one
    that did not complete. (What the worker refuses, an unknown agent or model, live tools its
    agent does not allow, fails the replay's turn with the worker's explanation.)"""


class ToolCallSummary(BaseModel):
    """A tool call by name and arguments, as replays compare them."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    # The result's text, and whether it was an error.
    result: str | None = None
    is_error: bool = False


class ReplaySide(BaseModel):
    """One turn of the comparison: the source, or its replay."""

    workflow_id: str
    agent: str | None = None
    # The models that answered (the keys of the turn's usage), in the order the turn has them.
    models: list[str] = Field(default_factory=list)
    final: str | None = None  # the final answer's text
    stop_reason: str
    iterations: int
    tool_calls: list[ToolCallSummary] = Field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    tokens: int = 0  # every token the model calls processed (cache reads and writes too)
    model_calls: int = 0
    cost_usd: float | None = None  # None: some model has no price
    started_at: datetime | None = None
    closed_at: datetime | None = None
    duration_ms: float | None = None


class ReplayReport(BaseModel):
    """A replay beside its source: what ``turnkeep replay`` prints, and ``--json`` writes."""

    source: ReplaySide
    replay: ReplaySide
    # Tool calls by name and arguments: made by both (the replay's got the recorded result),
    # only by the replay (answered with an error, or run for real with live tools), only by
    # the source. Each counted as often as made.
    same_calls: list[ToolCallSummary] = Field(default_factory=list)
    new_calls: list[ToolCallSummary] = Field(default_factory=list)
    missing_calls: list[ToolCallSummary] = Field(default_factory=list)
    same_final: bool = False  # whether the final answers' texts are equal


class ReplayHandle:
    """A replay in flight or done: ``turn`` is its turn (watch it, cancel it, ``show`` it)."""

    def __init__(self, client: Client, workflow_id: str, source_id: str) -> None:
        self.client = client
        self.workflow_id = workflow_id
        self.source_id = source_id
        self.turn: TurnHandle = get_turn(client, workflow_id)

    async def result(self) -> TurnResult:
        """The replay's result, once it has finished."""
        return await self.turn.result()

    async def report(self) -> ReplayReport:
        """Wait for the replay to finish, then set it beside its source."""
        replayed = await self.result()
        source = await get_turn(self.client, self.source_id).result()
        replay_description = await self.turn.handle.describe()
        source_description = await self.client.get_workflow_handle(self.source_id).describe()
        return build_report(
            _side(self.source_id, source, source_description),
            _side(self.workflow_id, replayed, replay_description),
        )


async def replay_turn(
    client: Client,
    turn_id: str,
    *,
    model: str | None = None,
    agent: str | None = None,
    instruction: str | None = None,
    live_tools: bool = False,
    workflow_id: str | None = None,
    task_queue: str | None = None,
) -> ReplayHandle:
    """Start a counterfactual replay of the finished turn ``turn_id``: its input again, on
    ``model`` (one the agent allows), as ``agent`` (default: the source's), or with
    ``instruction`` as the system prompt (an agent that lists `instruction` in its
    `overrides`). A tool call whose name and arguments match one the source made gets that
    call's recorded result, and no tool runs; any other call gets an error result, or, with
    ``live_tools`` and an agent whose config sets `replay_live_tools`, runs for real.
    ``task_queue``: as for ``start_turn``. Raises ``ReplayError`` for an unknown turn or one
    that has not completed."""
    source = await source_input(client, turn_id)
    name = agent or source.agent
    turn = TurnInput(
        agent=name,
        messages=source.messages,
        model=model,
        replay_of=ReplayOf(turn=turn_id, live_tools=live_tools, instruction=instruction),
    )
    present = await present_search_attributes(client)
    attributes = list(visibility.start_search_attributes(name, present))
    if visibility.REPLAY_OF.name in present:
        attributes.append(SearchAttributePair(visibility.REPLAY_OF, turn_id))
    id = workflow_id or f"replay-{name}-{uuid.uuid4().hex[:12]}"
    await client.start_workflow(
        WORKFLOW_NAME,
        turn,
        id=id,
        task_queue=task_queue or agent_task_queue(DEFAULT_TASK_QUEUE, name),
        result_type=TurnResult,
        static_summary=visibility.replay_summary(turn_id, model or name),
        search_attributes=TypedSearchAttributes(attributes),
    )
    return ReplayHandle(client, id, turn_id)


def get_replay(client: Client, workflow_id: str, source_id: str) -> ReplayHandle:
    """A replay started earlier, by its workflow id and its source's."""
    return ReplayHandle(client, workflow_id, source_id)


def build_report(source: ReplaySide, replay: ReplaySide) -> ReplayReport:
    """The two sides, with their tool calls matched by name and arguments."""
    left = Counter(call_key(c.name, c.arguments) for c in source.tool_calls)
    right = Counter(call_key(c.name, c.arguments) for c in replay.tool_calls)
    same: list[ToolCallSummary] = []
    new: list[ToolCallSummary] = []
    for call in replay.tool_calls:
        key = call_key(call.name, call.arguments)
        if left[key] > 0:
            left[key] -= 1
            same.append(call)
        else:
            new.append(call)
    missing: list[ToolCallSummary] = []
    for call in source.tool_calls:
        key = call_key(call.name, call.arguments)
        if right[key] > 0:
            right[key] -= 1
        else:
            missing.append(call)
    return ReplayReport(
        source=source,
        replay=replay,
        same_calls=same,
        new_calls=new,
        missing_calls=missing,
        same_final=source.final == replay.final,
    )


def _side(
    workflow_id: str, result: TurnResult, description: WorkflowExecutionDescription
) -> ReplaySide:
    usage = list(result.usage.values())
    costs = [u.cost_usd for u in usage]
    started, closed = description.start_time, description.close_time
    agent = description.typed_search_attributes.get(visibility.AGENT)
    return ReplaySide(
        workflow_id=workflow_id,
        agent=agent,
        models=list(result.usage),
        final=result.final.text if result.final is not None else None,
        stop_reason=result.stop_reason.value,
        iterations=result.iterations,
        tool_calls=[
            ToolCallSummary(
                name=c.name,
                arguments=c.arguments,
                result=c.result.text,
                is_error=c.result.is_error,
            )
            for c in recorded_calls(result.messages)
        ],
        input_tokens=sum(u.input_tokens for u in usage),
        output_tokens=sum(u.output_tokens for u in usage),
        tokens=sum(u.tokens for u in usage),
        model_calls=sum(u.calls for u in usage),
        cost_usd=None if None in costs else sum(c for c in costs if c is not None),
        started_at=started,
        closed_at=closed,
        duration_ms=(closed - started).total_seconds() * 1000 if closed else None,
    )


async def source_input(client: Client, turn_id: str) -> TurnInput:
    """The input of the finished turn ``turn_id`` (its agent and messages), read from the start
    of its latest run; ``ReplayError`` when there is no such finished turn."""
    handle = client.get_workflow_handle(turn_id)
    try:
        description = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise ReplayError(
                f"no turn with workflow id {turn_id!r} in namespace {client.namespace!r}"
            ) from None
        raise
    check_replayable(turn_id, description)
    async for event in handle.fetch_history_events():
        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            break
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        context = WorkflowSerializationContext(namespace=client.namespace, workflow_id=turn_id)
        converter = client.data_converter.with_context(context)
        [value, *_] = await converter.decode(payloads)
        return TurnInput.model_validate(value)
    raise ReplayError(f"the history of {turn_id!r} has no start event")


def check_replayable(turn_id: str, description: WorkflowExecutionDescription) -> None:
    """Raise ``ReplayError`` unless ``description`` is of a turn that completed."""
    if description.workflow_type != WORKFLOW_NAME:
        raise ReplayError(
            f"{turn_id!r} is a {description.workflow_type} workflow, not a turn: only a turn "
            "can be replayed"
        )
    status = description.status
    if status == WorkflowExecutionStatus.RUNNING:
        raise ReplayError(
            f"turn {turn_id!r} is still running: a replay starts from a finished turn"
        )
    if status != WorkflowExecutionStatus.COMPLETED:
        said = status.name.lower().replace("_", " ") if status is not None else "unknown"
        raise ReplayError(
            f"turn {turn_id!r} did not complete ({said}): only a completed turn has a whole "
            "record to replay"
        )
