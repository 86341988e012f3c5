"""The carrying floor: a bare workflow that carries what a turn's steps carry, and runs none of
turnkeep's code. It splits loop overhead in two: carrying a turn's data through Temporal, and
turnkeep's own work (the loop, the MCP tool runtime, the model adapter, the operator surface).

It runs the activities a turn of ``iterations`` runs, in the same order (prepare, list tools,
then a model call and a tool call in turn, and a last model call), each with the turn's
payload types and sizes (turnkeep's pydantic models, a 5 KB tool result) and the turn's
summary (``visibility``), scheduled as the turn schedules them (``actions.execute``: its
timeouts and retry policy), on turnkeep's data converter and payload storage; it returns a
``TurnResult`` as large as the turn's. Its activities answer at once with canned values, and it
keeps no search attributes or current details.
"""

from __future__ import annotations

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from turnkeep.config.settings import AgentSettings, TimeoutSettings
    from turnkeep.contract.activity_io import (
        PrepareTurnRequest,
        Timeouts,
        ToolCallOutcome,
        ToolCallRequest,
        ToolCatalog,
        ToolSpec,
        ToolsRequest,
        TurnPlan,
    )
    from turnkeep.contract.messages import (
        CallToolResult,
        Message,
        StopReason,
        TextContent,
        json_channel,
    )
    from turnkeep.contract.model_io import LlmStepRequest
    from turnkeep.contract.turn_io import TurnOverrides, TurnResult
    from turnkeep.workflows import visibility
    from turnkeep.workflows.actions import SETUP, execute

PREPARE, TOOLS, MODEL, TOOL = "carry_prepare", "carry_tools", "carry_model", "carry_tool"
AGENT, TOOL_NAME = "carry", "local__blob"
RESULT = "x" * 5 * 1024


def _timeouts(t: TimeoutSettings) -> Timeouts:
    return Timeouts.model_validate(t.model_dump())


@activity.defn(name=PREPARE)
async def carry_prepare(request: PrepareTurnRequest) -> TurnPlan:
    defaults = AgentSettings()  # the timeouts a turn's plan carries for an agent's defaults
    return TurnPlan(
        agent=request.agent,
        model="playback",
        max_iterations=100,
        use_history=True,
        parallel_tool_calls=True,
        has_tools=True,
        llm=_timeouts(defaults.llm_timeouts),
        tools=_timeouts(defaults.tool_timeouts),
    )


@activity.defn(name=TOOLS)
async def carry_tools(request: ToolsRequest) -> ToolCatalog:
    del request
    schema = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}
    names = ("blob", "blob_async", "line")  # the benchmark agents' tools
    specs = [ToolSpec(name=f"local__{n}", description="Tool.", input_schema=schema) for n in names]
    return ToolCatalog(tools=specs)


@activity.defn(name=MODEL)
async def carry_model(step: LlmStepRequest) -> Message:
    call = {"name": TOOL_NAME, "arguments": {"i": step.call_index}}
    usage = {"input_tokens": 1000 * step.call_index, "output_tokens": 9}
    return Message(
        role="assistant",
        tool_calls={f"c{step.call_index}": call},
        stop_reason=StopReason.TOOL_USE,
        channels={"usage": json_channel(usage)},
    )


@activity.defn(name=TOOL)
async def carry_tool(request: ToolCallRequest) -> ToolCallOutcome:
    text = f"result {request.arguments.get('i')}: {RESULT}"
    return ToolCallOutcome(result=CallToolResult(content=[TextContent(text=text)]), duration_ms=0.1)


ACTIVITIES = [carry_prepare, carry_tools, carry_model, carry_tool]


@workflow.defn(name="CarryFloor")
class CarryFloor:
    @workflow.run
    async def run(self, iterations: int) -> TurnResult:
        prepare = PrepareTurnRequest(agent=AGENT, overrides=TurnOverrides())
        summary = visibility.prepare_summary(AGENT)
        plan = await execute(PREPARE, prepare, TurnPlan, summary, SETUP)
        tools = ToolsRequest(agent=AGENT)
        await execute(TOOLS, tools, ToolCatalog, visibility.LIST_TOOLS_SUMMARY, plan.tools)
        info = workflow.info()
        messages = [Message.user("go")]
        for call in range(1, iterations + 2):
            step = LlmStepRequest(
                agent=AGENT,
                model=plan.model,
                call_index=call,
                workflow_id=info.workflow_id,
                run_id=info.run_id,
                digest="0" * 64,
            )
            summary = visibility.llm_summary(call, plan.model)
            answer = await execute(MODEL, step, Message, summary, plan.llm)
            messages.append(answer)
            if call > iterations:
                break
            call_id = f"c{call}"
            request = ToolCallRequest(
                agent=AGENT, call_id=call_id, name=TOOL_NAME, arguments={"i": call}
            )
            summary = visibility.tool_summary(request)
            outcome = await execute(TOOL, request, ToolCallOutcome, summary, plan.tools)
            messages.append(Message(role="user", tool_results={call_id: outcome.result}))
        return TurnResult(
            final=messages[-1],
            messages=messages,
            history=messages,
            stop_reason=StopReason.END_TURN,
            iterations=iterations,
        )
