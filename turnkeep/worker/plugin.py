"""``TurnkeepPlugin``: turnkeep's client and worker set-up through Temporal's plugin API.

Every payload is a pydantic model as JSON (the pydantic data converter), and payloads above
``payload_storage.threshold_bytes`` go to external storage with only a reference in the history
(``turnkeep/payloads/storage.py``). A worker's plugin also registers ``TurnWorkflow`` and the
activities built from the worker's settings, and closes pooled MCP connections when the worker
stops.

With ``encryption`` in the settings, every payload also goes through ``turnkeep.payloads.codec``'s
``EncryptionCodec`` (AES-256-GCM); the SDK encodes before it stores, so stored payloads are
encrypted too.

A Temporal worker encodes payloads with its *client's* data converter, so a worker must be built
from a client connected with the same payload storage and encryption as its settings
(``worker.connection.connect(settings=...)``); ``TurnkeepPlugin`` checks this at start-up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payloads
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    ExternalStorage,
    PayloadCodec,
)
from temporalio.exceptions import ApplicationError
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Worker,
    WorkerConfig,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowRunner,
)

from turnkeep.activities.hook_activity import Hook, HookActivities
from turnkeep.activities.mcp_pool import McpPool, import_callable
from turnkeep.activities.model_activity import ModelActivities
from turnkeep.activities.note import note
from turnkeep.activities.tool_activities import ToolActivities, tool_result_limit
from turnkeep.activities.turn_setup import TurnSetupActivities
from turnkeep.errors import known
from turnkeep.payloads.codec import describe_codec, payload_codec, same_codec
from turnkeep.payloads.converter import TurnkeepDataConverter, TurnkeepPayloadConverter
from turnkeep.payloads.storage import (
    describe_storage,
    external_storage,
    payload_sweeper,
    same_storage,
)
from turnkeep.settings import Settings
from turnkeep.worker.search_attributes import usable_search_attributes
from turnkeep.worker.workflow_runner import WORKFLOW_RUNNER
from turnkeep.workflows.turn_workflow import TurnWorkflow

FunctionTools = Mapping[str, Sequence[Callable[..., Any]]]


# Temporal's default limit on one payload (the server's blob size error limit). A workflow task
# whose commands carry a bigger one is refused, and retried for ever.
PAYLOAD_LIMIT_BYTES = 2 * 1024 * 1024
# Room for what wraps a tool result in its activity's payload.
_ENVELOPE_BYTES = 64 * 1024
RESULT_TOO_LARGE = "TurnResultTooLarge"


def data_converter(
    storage: ExternalStorage | None, codec: PayloadCodec | None = None
) -> DataConverter:
    """turnkeep's data converter: pydantic JSON payloads, large ones in ``storage``, all of them
    through ``codec`` (encryption) when there is one. The one place it is made.

    The SDK runs the codec before external storage, so what is stored is encoded too. With a
    codec, failures' messages and stack traces go into an encoded payload as well (Temporal's
    encoded failure attributes): an error can quote a prompt or a tool's output."""
    if codec is None:
        # No codec at all, not a pass-through one: the SDK then skips a pass over every
        # payload. An encrypted payload is refused by the payload converter instead.
        return TurnkeepDataConverter(
            payload_converter_class=TurnkeepPayloadConverter, external_storage=storage
        )
    return TurnkeepDataConverter(
        payload_converter_class=TurnkeepPayloadConverter,
        external_storage=storage,
        payload_codec=codec,
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )


class TurnkeepClientPlugin(SimplePlugin):
    """For clients that start and watch turns: the data converter, nothing else.

    Payload storage comes from ``storage`` if given, else from ``settings.payload_storage``
    (default settings when none are given: the ``local`` driver under the state directory),
    and encryption from ``settings.encryption``. A client needs the storage and keys its
    workers use, to read large results and write large inputs.
    """

    def __init__(
        self, settings: Settings | None = None, *, storage: ExternalStorage | None = None
    ) -> None:
        settings = settings or Settings()
        self.storage = storage if storage is not None else external_storage(settings)
        self.codec = payload_codec(settings)
        super().__init__("turnkeep-client", data_converter=data_converter(self.storage, self.codec))


class TurnkeepPlugin(SimplePlugin):
    """For workers (or a client that workers are built from): everything a turn needs."""

    def __init__(
        self,
        settings: Settings,
        *,
        function_tools: FunctionTools | None = None,
        hooks: Mapping[str, Hook] | None = None,
        storage: ExternalStorage | None = None,
    ) -> None:
        # `storage`, when given, replaces what `settings.payload_storage` describes.
        self.storage = storage if storage is not None else external_storage(settings)
        self.codec = payload_codec(settings)
        _check_tool_result_limit(settings, self.storage)
        self._payload_retention = settings.payload_storage.retention
        pool = McpPool(settings, function_tools)
        all_hooks: dict[str, Hook] = {
            name: import_callable(path, settings.base_dir) for name, path in settings.hooks.items()
        }
        all_hooks.update(hooks or {})
        _check_names(settings, set(pool.servers), set(all_hooks))
        tools = ToolActivities(settings, pool, storage_on=self.storage is not None)
        models = ModelActivities(settings)
        self._setup = TurnSetupActivities(settings)
        activities: list[Callable[..., Any]] = [
            self._setup.prepare_turn,
            models.llm_step,
            models.compact_history,
            tools.list_tools,
            tools.call_tool,
            HookActivities(settings, all_hooks).run_hook,
            note,
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
            data_converter=data_converter(self.storage, self.codec),
            workflows=[TurnWorkflow],
            activities=activities,
            workflow_runner=WORKFLOW_RUNNER,
            interceptors=_interceptors(self.storage),
            run_context=close_connections,
        )

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        # A worker takes its data converter from its client, never from a worker plugin.
        client = config.get("client")
        if client is not None:
            _check_client_storage(client.data_converter.external_storage, self.storage)
            _check_client_codec(client.data_converter.payload_codec, self.codec)
        return super().configure_worker(config)

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        # Before it polls: which search attributes its turns may set (warns once if some are
        # missing). prepare_turn records this in each turn's plan.
        usable = await usable_search_attributes(worker.client)
        self._setup.visibility = self._setup.visibility.model_copy(
            update={"search_attributes": usable}
        )
        # While a worker runs it sweeps old files from local payload storage, at start and
        # then periodically. A worker's job (not a replayer's or a client's): it has the
        # settings, and several workers sweeping one directory is safe.
        async with payload_sweeper(self.storage, self._payload_retention, worker.client):
            await super().run_worker(worker, next)


def _check_client_storage(client: ExternalStorage | None, worker: ExternalStorage | None) -> None:
    if not same_storage(client, worker):
        raise ValueError(
            "the worker's client and its settings disagree on payload storage: the client has "
            f"{describe_storage(client)}, payload_storage in the settings gives "
            f"{describe_storage(worker)}. Connect the client with the same settings "
            "(worker.connection.connect(..., settings=settings)) so it can read what the "
            "worker stores; every other client of these turns needs the same storage too."
        )


def _check_client_codec(client: PayloadCodec | None, worker: PayloadCodec | None) -> None:
    # A worker whose client lacks the codec would write every payload in clear.
    if not same_codec(client, worker):
        raise ValueError(
            "the worker's client and its settings disagree on payload encryption: the client has "
            f"{describe_codec(client)}, encryption in the settings gives "
            f"{describe_codec(worker)}. Connect the client with the same settings "
            "(worker.connection.connect(..., settings=settings)): the worker writes payloads "
            "with its client's converter."
        )


def _check_tool_result_limit(settings: Settings, storage: ExternalStorage | None) -> None:
    """Without external storage a tool result must fit in one payload with room to spare.
    (With it, results are not cut unless max_tool_result_bytes asks: they are stored whole.)"""
    if storage is not None:
        return
    ceiling = PAYLOAD_LIMIT_BYTES - _ENVELOPE_BYTES
    limit = tool_result_limit(settings, storage_on=False)
    if limit is not None and limit > ceiling:
        raise ValueError(
            f"max_tool_result_bytes is {limit:,} but payload_storage is off, so a tool result "
            f"may not pass {ceiling:,} bytes (Temporal's 2 MB payload limit less room for its "
            "envelope): lower it, or turn payload_storage on"
        )


def _interceptors(storage: ExternalStorage | None) -> list[Interceptor]:
    # With external storage a large result is stored, not refused: nothing to guard.
    return [] if storage is not None else [_ResultSizeGuard()]


class _ResultSizeGuard(Interceptor):
    """Without external storage: a turn whose result is over Temporal's payload limit fails,
    with an error saying so, instead of retrying its last workflow task for ever."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        del input
        return _ResultSizeInbound


class _ResultSizeInbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        result = await super().execute_workflow(input)
        # The bytes the SDK is about to send; the conversion is deterministic, so replay agrees.
        size = Payloads(payloads=workflow.payload_converter().to_payloads([result])).ByteSize()
        if size > PAYLOAD_LIMIT_BYTES - 1024:
            raise ApplicationError(
                f"The turn finished, but its result is {size / 1_000_000:.2f} MB, over "
                f"Temporal's {PAYLOAD_LIMIT_BYTES / 1_048_576:.0f} MB payload limit, so it cannot "
                "be recorded. Turn on payload_storage in the worker's turnkeep.yaml (driver: "
                "local or s3) to keep large payloads out of the history, or shorten turns "
                "(max_iterations, max_tool_result_bytes).",
                {"result_bytes": size, "limit_bytes": PAYLOAD_LIMIT_BYTES},
                type=RESULT_TOO_LARGE,
                non_retryable=True,
            )
        return result


def _check_names(settings: Settings, servers: set[str], hooks: set[str]) -> None:
    """A worker whose agents name servers or hooks it doesn't have must not start."""
    for agent, missing in settings.unknown_servers(servers).items():
        raise ValueError(
            f"agent {agent!r} names server(s) {missing} that are neither in mcp.servers nor "
            f"in function_tools (known: {known(servers)})"
        )
    for agent, missing in settings.unknown_hooks(hooks).items():
        raise ValueError(
            f"agent {agent!r} enables hook(s) {missing} that are not registered "
            f"(known: {known(hooks)})"
        )


def replay_plugin(
    settings: Settings | None = None,
    *,
    storage: ExternalStorage | None = None,
    workflow_runner: WorkflowRunner = WORKFLOW_RUNNER,
) -> SimplePlugin:
    """What a ``Replayer`` needs to replay turn histories: the workflow, runner, converter
    (with the workers' payload storage and encryption keys, to read offloaded and encrypted
    payloads) and interceptors. The replay tests pass ``STRICT_WORKFLOW_RUNNER``."""
    settings = settings or Settings()
    if storage is None:
        storage = external_storage(settings)
    return SimplePlugin(
        "turnkeep-replay",
        data_converter=data_converter(storage, payload_codec(settings)),
        workflows=[TurnWorkflow],
        workflow_runner=workflow_runner,
        interceptors=_interceptors(storage),
    )
