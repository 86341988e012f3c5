"""``TurnkeepPlugin``: turnkeep's client and worker set-up through Temporal's plugin API.

Every payload is a pydantic model as JSON (the pydantic data converter). A worker's plugin also
registers ``TurnWorkflow`` and the activities built from the worker's settings, and closes pooled
MCP connections when the worker stops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.plugin import SimplePlugin
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.mcp_pool import McpPool
from activities.model_activity import ModelActivities
from activities.settings import Settings
from activities.tool_activities import ToolActivities
from activities.turn_setup import TurnSetupActivities
from workflows.turn_workflow import TurnWorkflow

# Deterministic, side-effect-free modules the sandbox may share across workflow runs instead
# of re-importing them (and rebuilding every pydantic model) for each run. `beartype` is here
# because fastmcp's key_value dependency installs beartype's import hook process-wide; left
# sandboxed, every workflow run re-imported beartype through it (~450 ms per new turn).
_PASSTHROUGH = (
    "beartype",
    "workflows.messages",
    "workflows.turn_io",
    "workflows.activity_io",
    "workflows.repair",
    "workflows.loop",
)

WORKFLOW_RUNNER = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules(*_PASSTHROUGH)
)

FunctionTools = Mapping[str, Sequence[Callable[..., Any]]]


class TurnkeepClientPlugin(SimplePlugin):
    """For clients that start and watch turns: the data converter, nothing else."""

    def __init__(self) -> None:
        super().__init__("turnkeep-client", data_converter=pydantic_data_converter)


class TurnkeepPlugin(SimplePlugin):
    """For workers (or a client that workers are built from): everything a turn needs."""

    def __init__(self, settings: Settings, *, function_tools: FunctionTools | None = None) -> None:
        pool = McpPool(settings, function_tools)
        for agent, missing in settings.unknown_servers(set(pool.servers)).items():
            raise ValueError(
                f"agent {agent!r} names server(s) {missing} that are neither in mcp.servers nor "
                f"in function_tools (known: {', '.join(pool.servers) or 'none'})"
            )
        tools = ToolActivities(settings, pool)
        activities: list[Callable[..., Any]] = [
            TurnSetupActivities(settings).prepare_turn,
            ModelActivities(settings).llm_step,
            tools.list_tools,
            tools.call_tool,
        ]

        @asynccontextmanager
        async def close_pool() -> AsyncIterator[None]:
            try:
                yield
            finally:
                await pool.aclose()

        super().__init__(
            "turnkeep",
            data_converter=pydantic_data_converter,
            workflows=[TurnWorkflow],
            activities=activities,
            workflow_runner=WORKFLOW_RUNNER,
            run_context=close_pool,
        )


def replay_plugin() -> SimplePlugin:
    """What a ``Replayer`` needs to replay turn histories: the workflow, runner and converter."""
    return SimplePlugin(
        "turnkeep-replay",
        data_converter=pydantic_data_converter,
        workflows=[TurnWorkflow],
        workflow_runner=WORKFLOW_RUNNER,
    )
