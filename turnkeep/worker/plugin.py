"""``TurnkeepPlugin``: turnkeep's client and worker set-up through Temporal's plugin API, the
one way a worker gets turnkeep (``build_worker`` and ``turnkeep worker`` use it too).

It adds to an application's set-up rather than replacing it (``turnkeep.payloads.composition``):
every payload is a pydantic model as JSON, and payloads above
``payload_storage.threshold_bytes`` go to external storage with only a reference in the history
(``turnkeep.payloads.storage``), while the application's payload codec keeps encoding them.
A worker's plugin also registers ``TurnWorkflow`` and the activities built from the worker's
settings and its Python agents (``turnkeep.config.agents``), beside the application's own; adds
the model-input hand-off interceptor and the one that lets turns and sessions waiting for people
leave the worker's cache (``turnkeep.worker.cache_release``); and closes pooled MCP connections
when the worker stops.

With ``encryption`` in the settings, every payload also goes through ``turnkeep.payloads.codec``'s
``EncryptionCodec`` (AES-256-GCM); the SDK encodes before it stores, so stored payloads are
encrypted too.

A Temporal worker encodes payloads with its *client's* data converter. A client turnkeep made
(``turnkeep.connect(settings=...)``) must have the storage and encryption of the worker's
settings, which the plugin checks at start-up; any other client is given turnkeep's converter
for this worker, on the same connection.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.converter import DataConverter, ExternalStorage
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    Worker,
    WorkerConfig,
)

from turnkeep.activities.approval_policy import ApprovalPolicyActivities, load_policies
from turnkeep.activities.child_turn import read_child_turn
from turnkeep.activities.evaluation import EvaluationActivities
from turnkeep.activities.hooks import Hook, HookActivities
from turnkeep.activities.limits import LimitActivities
from turnkeep.activities.model import ModelActivities
from turnkeep.activities.model_input import ModelInputHandoffInterceptor
from turnkeep.activities.replay_source import ReplayActivities
from turnkeep.activities.tools import ToolActivities, tool_result_limit
from turnkeep.activities.turn_setup import TurnSetupActivities, continue_as_new_plan
from turnkeep.config.agents import Agent, McpServer, declare
from turnkeep.config.callables import import_callable
from turnkeep.config.catalog import AgentCatalog
from turnkeep.config.files import announce_configuration
from turnkeep.config.settings import Settings
from turnkeep.contract.activity_io import PAYLOAD_ENVELOPE_BYTES, PAYLOAD_LIMIT_BYTES
from turnkeep.contract.approval import ApprovalPolicy
from turnkeep.errors import known
from turnkeep.observability.recording import ActivityMetrics, set_storage_runtime
from turnkeep.observability.search_attributes import usable_search_attributes
from turnkeep.observability.setup import tracing_interceptors
from turnkeep.payloads.codec import payload_codec
from turnkeep.payloads.composition import turnkeep_converter, with_converter
from turnkeep.payloads.gc import payload_sweeper
from turnkeep.payloads.limits import result_size_guard
from turnkeep.payloads.storage import external_storage
from turnkeep.providers.base import ModelProvider
from turnkeep.providers.registry import (
    ModelCatalog,
    announce_unknown_context_windows,
    installed_providers,
)
from turnkeep.tools.registry import ToolServers, installed_tool_sources
from turnkeep.tools.source import ToolSource
from turnkeep.worker.cache_release import CacheRelease
from turnkeep.worker.live_server import LiveStreams
from turnkeep.worker.runner import with_passthrough
from turnkeep.workflows.evaluation import EvaluationWorkflow
from turnkeep.workflows.limits.limiter import LimiterWorkflow
from turnkeep.workflows.session_workflow import SessionWorkflow
from turnkeep.workflows.turn_workflow import TurnWorkflow

FunctionTools = Mapping[str, Sequence[Callable[..., Any]]]


class TurnkeepPlugin(SimplePlugin):
    """Everything a turn needs, for a worker (or a client that workers are built from):
    ``Worker(client, task_queue="my-app", workflows=[MyWorkflow], activities=[my_activity],
    plugins=[TurnkeepPlugin(agents=[Agent(...)])])`` runs turns beside the application's own
    workflows, on its task queue.

    ``settings`` (a turnkeep.yaml's; default: no agents, payload storage under the state
    directory) are merged with ``agents`` and ``servers`` (``turnkeep.config.agents``);
    ``function_tools``, ``hooks`` and ``approval_policies`` register more functions by server,
    hook and policy name, over the settings' hooks and policies of the same name; ``storage``
    replaces what ``settings.payload_storage`` describes. ``providers`` and ``tool_sources``
    register model providers and kinds of tool server (``mcp.servers`` entries whose
    ``transport`` names them) beside the built-in and installed ones.
    ``model_input_handoff=False`` makes every model call read its input by query, as one
    running on another worker does (benchmarks compare the two).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        agents: Sequence[Agent] = (),
        servers: Sequence[McpServer] = (),
        function_tools: FunctionTools | None = None,
        hooks: Mapping[str, Hook] | None = None,
        approval_policies: Mapping[str, ApprovalPolicy] | None = None,
        storage: ExternalStorage | None = None,
        providers: Sequence[type[ModelProvider]] = (),
        tool_sources: Sequence[type[ToolSource]] = (),
        model_input_handoff: bool = True,
    ) -> None:
        settings = settings or Settings()
        named_hooks: dict[str, Hook] = {
            name: import_callable(path, settings.base_dir) for name, path in settings.hooks.items()
        }
        named_policies: dict[str, ApprovalPolicy] = {
            name: import_callable(path, settings.base_dir)
            for name, path in settings.approval_policies.items()
        }
        declared = declare(
            settings,
            agents,
            servers,
            function_tools,
            {**named_hooks, **(hooks or {})},
            {**named_policies, **(approval_policies or {})},
        )
        settings = declared.settings
        # Each part of the worker gets the part of the settings it uses, cut here. YAML and
        # Python agents alike: what every activity re-checks requests against.
        agent_catalog = AgentCatalog.of(settings)
        self.storage = (
            storage
            if storage is not None
            else external_storage(settings.payload_storage, settings.base_dir)
        )
        self.codec = payload_codec(settings.encryption)
        max_result_bytes = tool_result_limit(
            settings.max_tool_result_bytes, storage_on=self.storage is not None
        )
        _check_tool_result_limit(max_result_bytes, self.storage)
        self._payload_retention = settings.payload_storage.retention
        # Server entries are served by the built-in and installed tool sources, and these.
        pool = ToolServers(
            settings,
            declared.function_tools,
            installed_tool_sources().extended(tool_sources),
        )
        all_hooks = declared.hooks
        _check_names(agent_catalog, set(pool.servers), set(all_hooks))
        # Every policy an agent names, or the worker does not start.
        policies = load_policies(agent_catalog, declared.approval_policies)
        tools = ToolActivities(agent_catalog, pool, max_result_bytes=max_result_bytes)
        # Model strings resolve to the built-in and installed providers, and these.
        model_catalog = ModelCatalog(settings, installed_providers().extended(providers))
        live = LiveStreams(settings.streaming) if settings.streaming else None
        models = ModelActivities(agent_catalog, model_catalog, live)
        self._setup = TurnSetupActivities(
            agent_catalog,
            model_catalog,
            continue_as_new=continue_as_new_plan(
                settings.continue_as_new, storage_on=settings.payload_storage.driver != "off"
            ),
            visibility=settings.visibility,
            max_agent_depth=settings.max_agent_depth,
        )
        self._config_file, self._ignored_keys = settings.config_file, settings.ignored_keys
        self._unknown_windows = model_catalog.unknown_context_windows(agent_catalog.values())
        limits = LimitActivities(settings.limits)
        activities: list[Callable[..., Any]] = [
            self._setup.prepare_turn,
            models.llm_step,
            models.compact_history,
            tools.list_tools,
            tools.call_tool,
            HookActivities(agent_catalog, all_hooks).run_hook,
            ApprovalPolicyActivities(agent_catalog, policies).approval_policy,
            # A parent workflow's `turnkeep.in_workflow.run_turn` reads a cancelled turn with it.
            read_child_turn,
            # A counterfactual replay reads its source turn's record with it.
            ReplayActivities(agent_catalog).replay_source,
            # An evaluation from history lists turns, compares pairs and runs function judges.
            *_evaluation_activities(settings, agent_catalog),
            # Turns ask the limiters of `limits:` for capacity; a limiter reads its values.
            limits.ask_capacity,
            limits.limit_values,
        ]

        # The agents whose turns this plugin serves (each on its own task queue, with
        # `build_workers`), and what the workers sharing it close when the last one stops.
        self.agents = sorted(settings.agents)
        self._closing = (pool.aclose, models.aclose)
        self._workers_running = 0
        self._process: AsyncExitStack | None = None
        self._process_lock = asyncio.Lock()

        # Traces first (outermost), when observability.tracing is on; metrics always: they go
        # to whatever exporter the worker's runtime has (none: nothing is recorded).
        # Turns and sessions waiting for people ask to leave the worker's workflow cache.
        self._cache_release = CacheRelease(settings.worker.idle_session_cache)
        interceptors = [
            *tracing_interceptors(settings.observability),
            ActivityMetrics(),
            self._cache_release,
            *result_size_guard(self.storage),
        ]
        if model_input_handoff:
            # A model call that runs on this worker takes its input from the workflow in
            # memory instead of by query (``ModelInputHandoff``): a round trip less per
            # iteration.
            interceptors.append(ModelInputHandoffInterceptor())
        super().__init__(
            "turnkeep",
            data_converter=self._converter,
            # A session runs its turns as children, on the worker's task queue by default.
            workflows=[TurnWorkflow, SessionWorkflow, EvaluationWorkflow, LimiterWorkflow],
            activities=activities,
            workflow_runner=with_passthrough,
            interceptors=interceptors,
        )

    def _converter(self, existing: DataConverter | None) -> DataConverter:
        return turnkeep_converter(existing, self.storage, self.codec)

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        # A worker converts payloads with its client's converter, and a worker plugin cannot
        # change that client: the worker gets one with turnkeep's converter added, on the same
        # connection (the client itself when turnkeep made it).
        client = config.get("client")
        if client is not None:
            config["client"] = with_converter(client, self._converter(client.data_converter))
        shorter_sticky_timeout(config)
        # Where this worker's turns start the turns of the agents they call: on the agents'
        # own queues if this plugin's workers poll them, else beside the calling turn.
        # Recorded as the worker is built, so every queue of ``build_workers`` is known
        # before the first of them polls.
        if (queue := config.get("task_queue")) is not None:
            self._setup.worker_queues.add(queue)
        return super().configure_worker(config)

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        async with self._serving_process(worker.client):
            with self._cache_release.serving(worker):
                await next(worker)

    @asynccontextmanager
    async def _serving_process(self, client: Client) -> AsyncIterator[None]:
        """What the process does once however many workers share this plugin (one per task
        queue, with ``build_workers``): the first to start announces the configuration, checks
        the search attributes and starts the payload sweeper; the last to stop closes them,
        the model clients and the tool connections."""
        async with self._process_lock:
            if self._workers_running == 0:
                self._process = await self._start_process(client)
            self._workers_running += 1
        try:
            yield
        finally:
            async with self._process_lock:
                self._workers_running -= 1
                if self._workers_running == 0 and self._process is not None:
                    process, self._process = self._process, None
                    await process.aclose()

    async def _start_process(self, client: Client) -> AsyncExitStack:
        announce_configuration(self._config_file, self._ignored_keys)
        announce_unknown_context_windows(self._unknown_windows)
        # Payload storage records the bytes it writes on this worker's runtime.
        set_storage_runtime(client.service_client.config.runtime)
        # Before it polls: which search attributes its turns may set (warns once if some are
        # missing). prepare_turn records this in each turn's plan.
        usable = await usable_search_attributes(client)
        self._setup.visibility = self._setup.visibility.model_copy(
            update={"search_attributes": usable}
        )
        stack = AsyncExitStack()
        for close in self._closing:
            stack.push_async_callback(close)
        # While a worker runs it sweeps old files from local payload storage, at start and
        # then periodically. A worker's job (not a replayer's or a client's): it has the
        # settings, and several workers sweeping one directory is safe.
        await stack.enter_async_context(
            payload_sweeper(self.storage, self._payload_retention, client)
        )
        return stack


def _check_tool_result_limit(limit: int | None, storage: ExternalStorage | None) -> None:
    """Without external storage a tool result must fit in one payload with room to spare.
    (With it, results are not cut unless max_tool_result_bytes asks: they are stored whole.)"""
    if storage is not None:
        return
    ceiling = PAYLOAD_LIMIT_BYTES - PAYLOAD_ENVELOPE_BYTES
    if limit is not None and limit > ceiling:
        raise ValueError(
            f"max_tool_result_bytes is {limit:,} but payload_storage is off, so a tool result "
            f"may not pass {ceiling:,} bytes (Temporal's 2 MB payload limit less room for its "
            "envelope): lower it, or turn payload_storage on"
        )


def _evaluation_activities(settings: Settings, agents: AgentCatalog) -> list[Callable[..., Any]]:
    """An evaluation's activities, with the judges the config lists imported now: a judge
    that cannot be imported stops the worker at its start, not an evaluation later."""
    judges = {path: import_callable(path, settings.base_dir) for path in settings.judges}
    evaluation = EvaluationActivities(agents, judges)
    return [evaluation.list_evaluation_turns, evaluation.score_replay]


def _check_names(agents: AgentCatalog, servers: set[str], hooks: set[str]) -> None:
    """A worker whose agents name servers or hooks it doesn't have must not start."""
    for agent, missing in agents.unknown_servers(servers).items():
        raise ValueError(
            f"agent {agent!r} names server(s) {missing} that are neither in mcp.servers nor "
            f"in function_tools (known: {known(servers)})"
        )
    for agent, missing in agents.unknown_hooks(hooks).items():
        raise ValueError(
            f"agent {agent!r} enables hook(s) {missing} that are not registered "
            f"(known: {known(hooks)})"
        )
    for problem in [*agents.team_problems(), *agents.inline_problems()]:
        raise ValueError(problem)


_SDK_STICKY_DEFAULT = (
    inspect.signature(Worker).parameters["sticky_queue_schedule_to_start_timeout"].default
)


# A turn's next step (and the query a model call reads its input by) waits on the worker that
# last ran it for this long before any worker may take it: after a crash, that is dead time.
STICKY_TIMEOUT = timedelta(seconds=3)


def shorter_sticky_timeout(config: WorkerConfig) -> None:
    """``STICKY_TIMEOUT`` unless the worker was given a timeout other than the SDK's default."""
    given = config.get("sticky_queue_schedule_to_start_timeout", _SDK_STICKY_DEFAULT)
    if given == _SDK_STICKY_DEFAULT:
        config["sticky_queue_schedule_to_start_timeout"] = STICKY_TIMEOUT
