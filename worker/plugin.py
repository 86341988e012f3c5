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

from activities.hook_activity import Hook, HookActivities
from activities.mcp_pool import McpPool, import_callable
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

    def __init__(
        self,
        settings: Settings,
        *,
        function_tools: FunctionTools | None = None,
        hooks: Mapping[str, Hook] | None = None,
    ) -> None:
        pool = McpPool(settings, function_tools)
        all_hooks: dict[str, Hook] = {
            name: import_callable(path, settings.base_dir) for name, path in settings.hooks.items()
        }
        all_hooks.update(hooks or {})
        _check_names(settings, set(pool.servers), set(all_hooks))
        tools = ToolActivities(settings, pool)
        models = ModelActivities(settings)
        activities: list[Callable[..., Any]] = [
            TurnSetupActivities(settings).prepare_turn,
            models.llm_step,
            models.compact_history,
            tools.list_tools,
            tools.call_tool,
            HookActivities(all_hooks).run_hook,
        ]

        @asynccontextmanager
        async def close_connections() -> AsyncIterator[None]:
            try:
                yield
            finally:
                await pool.aclose()
                await models.aclose()

        super().__init__(
            "turnkeep",
            data_converter=pydantic_data_converter,
            workflows=[TurnWorkflow],
            activities=activities,
            workflow_runner=WORKFLOW_RUNNER,
            run_context=close_connections,
        )


def _check_names(settings: Settings, servers: set[str], hooks: set[str]) -> None:
    """A worker whose agents name servers or hooks it doesn't have must not start."""
    for agent, missing in settings.unknown_servers(servers).items():
        raise ValueError(
            f"agent {agent!r} names server(s) {missing} that are neither in mcp.servers nor "
            f"in function_tools (known: {', '.join(sorted(servers)) or 'none'})"
        )
    for agent, missing in settings.unknown_hooks(hooks).items():
        raise ValueError(
            f"agent {agent!r} enables hook(s) {missing} that are not registered "
            f"(known: {', '.join(sorted(hooks)) or 'none'})"
        )


def replay_plugin() -> SimplePlugin:
    """What a ``Replayer`` needs to replay turn histories: the workflow, runner and converter."""
    return SimplePlugin(
        "turnkeep-replay",
        data_converter=pydantic_data_converter,
        workflows=[TurnWorkflow],
        workflow_runner=WORKFLOW_RUNNER,
    )
