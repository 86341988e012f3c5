"""An agent called as a tool (or as a team step) run *inline*, its loop inside the calling
turn's workflow rather than as a child workflow (``agent_tools``), for an agent whose config
says ``call: inline`` (an opt-in; the child is the default).

The called agent's plan comes from ``prepare_turn`` as a local activity of the caller's workflow
task (this worker's config, checked as for any turn); its model and tool calls are activities
of the caller's workflow, each summary naming the agent, at the agent's own plan priority
(``task_priority.scheduling_at``), its model calls within their limits as the caller's are and
never streamed (their live text would read as the caller's). What a child turn costs in server
transactions (starting it, the parent woken on its start, the child's own workflow tasks, its
result sent back) is saved; what is given up is the child's own history, its entry in the Web
UI, its own cancellation, task queue and continue-as-new (its whole loop is one step of the
caller's history, so a worker bounds its ``max_iterations``), and live text.

Only the plain loop runs inline: model calls, and tool calls that need no one (no approval, no
client, no server request). A worker refuses a config whose inline agent has anything else
(``AgentCatalog.inline_problems``); ``refusal`` checks the plan again at the call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from turnkeep.contract.activity_io import AgentTool, ToolCallOutcome, ToolCallRequest, TurnPlan
from turnkeep.contract.messages import CallToolResult, Message
from turnkeep.contract.model_io import LlmRequest, MessageJson
from turnkeep.contract.turn_io import TurnInput
from turnkeep.workflows import actions, task_priority
from turnkeep.workflows.agent_tools import AgentCall, agent_result, team_usage
from turnkeep.workflows.limits.capacity import Capacity
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.shared import shared
from turnkeep.workflows.task_priority import temporal_priority
from turnkeep.workflows.tool_batch import ToolBatch


class InlineCalls:
    """What a workflow keeps for the agents it runs inline."""

    def __init__(self) -> None:
        # The requests of the inline loops' model calls in flight, by agent call:
        # ``MODEL_INPUT_QUERY`` answers from here for a step that names its call
        # (``LlmStepRequest.inline``).
        self.inputs: dict[str, LlmRequest] = {}
        # Each called agent's plan, asked for once per run: every call of the agent in the turn
        # has the same depth, priority and tenant, so the same plan, and a call after the first
        # records no marker of its own (calls in one batch share the one in flight).
        self.plans: dict[str, asyncio.Task[TurnPlan]] = {}

    def plan(self, turn: TurnInput) -> asyncio.Task[TurnPlan]:
        task = self.plans.get(turn.agent)
        if task is None:
            task = asyncio.ensure_future(actions.prepare_turn(turn, local=True))
            self.plans[turn.agent] = task
        return task


def refusal(plan: TurnPlan) -> str | None:
    """What in the called agent's plan the inline loop does not run (None: nothing). A worker
    refuses a config whose inline agent has any of it (``AgentCatalog.inline_problems``), and
    a step asked for structured output is not run inline, so this finds something only when
    the worker that planned the caller's turn (and so marked the agent inline) had another
    config than the one running the call: a guard, rarely met, after which the call runs as
    a child turn."""
    unsupported = {
        "a workflow agent's steps": plan.team is not None,
        "hooks": bool(plan.hooks),
        "approval": plan.approval is not None,
        "client tools": plan.client_tools is not None,
        "agent tools": bool(plan.agent_tools),
        "a budget": plan.budget is not None,
        "fallback models": bool(plan.fallback_models),
        "server requests": bool(plan.server_requests),
        "structured output": plan.structured_output is not None,
    }
    found = [what for what, present in unsupported.items() if present]
    return ", ".join(found) or None


async def run_agent(
    tool: AgentTool,
    messages: list[Message],
    *,
    key: str,
    depth: int,
    parent: TurnPlan,
    calls: InlineCalls,
    capacity: Capacity | None = None,
    show: Callable[[str], None] | None = None,
) -> AgentCall | None:
    """Run ``tool``'s agent on ``messages`` inside this workflow, under ``key`` (unique among
    the turn's agent calls: the child turn id it would have had), at the ``parent`` turn's
    priority and for its tenant. None when its plan asks for what only a child turn runs
    (the caller then starts one). A cancelled caller's cancellation goes through: the call
    is then one of the batch's interrupted calls, which the caller's repair answers."""
    turn = TurnInput(
        agent=tool.agent,
        messages=messages,
        depth=depth + 1,
        priority=parent.priority,
        tenant=parent.fairness_key,
    )
    try:
        # Not shielded: only a cancelled turn cancels a call, and then every call and the turn.
        plan = shared(await calls.plan(turn))
    except ApplicationError as err:  # an unknown agent, a depth past the limit...
        kind = f"{err.type}: " if err.type else ""
        return AgentCall(CallToolResult.error(f"Error: {kind}{err.message}"), {})
    why = refusal(plan)
    if why is not None:
        workflow.logger.warning("agent %s runs as a child turn, not inline: %s", tool.agent, why)
        return None
    # Its activities carry its own plan's priority, as a child turn's would.
    with task_priority.scheduling_at(temporal_priority(plan.priority, plan.fairness_key)):
        return await _loop(tool, turn, plan, key, calls, capacity, show)


async def _loop(
    tool: AgentTool,
    turn: TurnInput,
    plan: TurnPlan,
    key: str,
    calls: InlineCalls,
    capacity: Capacity | None,
    show: Callable[[str], None] | None,
) -> AgentCall:
    """The called agent's loop, its model calls' requests in ``calls`` under ``key``."""
    state = TurnState.start(turn, plan)
    try:
        state.tools = [shared(t) for t in await actions.list_tools(plan)]
    except ActivityError as err:
        return AgentCall(CallToolResult.error(f"Error: {actions.failure_text(err)}"), {})
    json = MessageJson()
    while not state.done:
        request = state.model_request()
        calls.inputs[key] = request
        try:
            # A model with a limit waits for the caller's capacity, as the caller's calls do.
            answer = await actions.call_model(request, plan, json, capacity, show, inline=key)
        finally:
            del calls.inputs[key]
        state.on_assistant(answer, request.model)
        if state.awaiting_tools:
            batch = _scoped(state.tool_batch(), key)
            results, timing = await actions.run_tools(
                batch, plan, {}, _no_approval, _no_agent_call, inline=True
            )
            state.on_tool_results(results, timing)
    result = state.result()
    return AgentCall(agent_result(result), team_usage(result, tool.agent))


def _scoped(batch: ToolBatch, key: str) -> ToolBatch:
    """The batch's calls scoped by the agent call (``ToolCallRequest.scope``): what follows
    the workflow's id in ``key``, so a tool sees the key it would in a child turn."""
    scope = key.removeprefix(f"{workflow.info().workflow_id}/")
    to_run = [call.model_copy(update={"scope": scope}) for call in batch.to_run]
    return batch.model_copy(update={"to_run": to_run})


# ``refusal`` leaves no gated call and no agent tool: these answer what cannot be asked.
async def _no_approval(call: ToolCallRequest) -> CallToolResult:
    return CallToolResult.error(f"Error: {call.name} needs an approval, not given inline")


async def _no_agent_call(call: ToolCallRequest, tool: AgentTool) -> ToolCallOutcome:
    result = CallToolResult.error(f"Error: agent {tool.agent} cannot be called from inline")
    return ToolCallOutcome(result=result, duration_ms=0.0)
