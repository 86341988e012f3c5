"""The ``replay_source`` activity: what a counterfactual replay starts from, read by the worker
from the source turn's own history with its own client: the source's input and every tool call
it made with the result it got.

Any client may start a turn with any ``replay_of``, so this reads only a completed turn of an
agent this worker serves, and grants live tools or an instruction only where the replay's
agent allows them. The results come from Temporal, decoded with the worker's converter (its
encryption keys, its payload storage), never from the client: a replay can only give the
model results the source turn really got.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.converter import WorkflowSerializationContext
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.config.catalog import AgentCatalog
from turnkeep.contract.replay_io import (
    REPLAY_REFUSED,
    REPLAY_SOURCE,
    ReplaySource,
    ReplaySourceRequest,
    recorded_calls,
)
from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.errors import config_error, require_workflow
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME


class ReplayActivities:
    def __init__(self, agents: AgentCatalog) -> None:
        self._agents = agents

    @activity.defn(name=REPLAY_SOURCE)
    async def replay_source(self, request: ReplaySourceRequest) -> ReplaySource:
        require_workflow()
        if activity.info().workflow_type != WORKFLOW_NAME:
            raise _refused("only a turn replays a turn")
        replay = request.replay
        agent = self._agents.agent(request.agent)
        if replay.live_tools and not agent.replay_live_tools:
            raise _refused(
                f"agent {request.agent!r} does not let a replay run tools live: set "
                "`replay_live_tools: true` on it in the worker's config, or replay without "
                "--live-tools (unmatched calls then get an error result)"
            )
        if replay.instruction is not None and "instruction" not in agent.overrides:
            raise _refused(
                f"agent {request.agent!r} does not let a replay set its instruction: list "
                "`instruction` in its `overrides` in the worker's config"
            )
        turn, result = await _read_source(replay.turn)
        if turn.agent not in self._agents:
            raise _refused(
                f"turn {replay.turn!r} is a turn of agent {turn.agent!r}, which this worker "
                "does not serve: a worker replays only turns of its own agents"
            )
        return ReplaySource(
            agent=turn.agent,
            messages=turn.messages,
            history=list(turn.history),
            calls=recorded_calls(result.messages),
            live_tools=replay.live_tools,
            instruction=replay.instruction,
        )


async def _read_source(workflow_id: str) -> tuple[TurnInput, TurnResult]:
    """The input and result of the completed turn ``workflow_id`` (its latest run's start
    carries the turn's input, whichever run it is)."""
    client = activity.client()
    handle = client.get_workflow_handle(workflow_id, result_type=TurnResult)
    try:
        described = await handle.describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        raise _refused(f"no turn with workflow id {workflow_id!r}") from None
    if described.workflow_type != WORKFLOW_NAME:
        raise _refused(f"{workflow_id!r} is a {described.workflow_type} workflow, not a turn")
    if described.status == WorkflowExecutionStatus.RUNNING:
        raise _refused(f"turn {workflow_id!r} is still running: a replay needs a finished turn")
    if described.status != WorkflowExecutionStatus.COMPLETED:
        raise _refused(f"turn {workflow_id!r} did not complete: only a completed turn replays")
    context = WorkflowSerializationContext(namespace=client.namespace, workflow_id=workflow_id)
    converter = client.data_converter.with_context(context)
    turn: TurnInput | None = None
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            [first, *_] = await converter.decode(payloads)
            turn = TurnInput.model_validate(first)
        break
    if turn is None:
        raise _refused(f"the history of {workflow_id!r} has no start event")
    try:
        result = await handle.result()
    except WorkflowFailureError as err:  # closed otherwise since the description
        raise _refused(f"turn {workflow_id!r} did not complete: {err}") from None
    return turn, result


def _refused(message: str) -> BaseException:
    return config_error(REPLAY_REFUSED, f"cannot replay: {message}")
