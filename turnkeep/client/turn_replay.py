"""Replaying one run of a turn through ``TurnWorkflow`` itself, to capture its state where the
history ends: no worker has to be running.

The conversation is not re-derived from events. The run's history is replayed
(``temporalio.worker.Replayer``, with the client's data converter, so payload storage and any
codec apply), and what the run's ``TurnState`` holds when the history runs out is the turn:
finished for a completed run, repaired for a cancelled one (replay runs the cancellation path),
as far as it got for a running one. A copy is taken before the end-of-replay eviction
(``_FreezingRunner``), which would otherwise run the cancellation path on any turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import SerializationContext, StorageDriverStoreContext
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    UnsandboxedWorkflowRunner,
    WorkflowInboundInterceptor,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowInterceptorClassInput,
    WorkflowRunner,
)

from turnkeep.contract.turn_io import TurnInput
from turnkeep.worker.replay import replay_plugin
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.turn_workflow import TurnWorkflow


@dataclass(frozen=True)
class Replayed:
    """What a replay of one run of a turn captured."""

    turn: TurnInput | None  # the run's input
    state: TurnState | None  # the loop's state where the history ends; None before the loop
    failure: str | None  # why the history did not replay, if it did not


async def replay_turn(client: Client, history: WorkflowHistory) -> Replayed:
    """Replay ``history`` (one run of a turn) through ``TurnWorkflow``, with the client's data
    converter, and capture the run's input and its state where the history ends."""
    capture = _Capture()
    plugin = SimplePlugin(
        "turnkeep-read",
        # The client's converter: whatever storage and codec it reads payloads with.
        data_converter=client.data_converter,
        # Unsandboxed: this replay only reads, and it skips the sandbox's per-run imports.
        workflow_runner=_FreezingRunner(capture),
        interceptors=[capture],
    )
    with ThreadPoolExecutor(max_workers=1) as pool:
        replayer = Replayer(
            workflows=[],
            plugins=[replay_plugin(storage=client.data_converter.external_storage), plugin],
            workflow_task_executor=pool,
        )
        outcome = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    failure = outcome.replay_failure
    return Replayed(
        turn=capture.turn,
        state=capture.frozen,
        failure=f"{type(failure).__name__}: {failure}" if failure else None,
    )


class _Capture(Interceptor):
    """Keeps the replayed workflow object, and a copy of its state taken when replay ends.

    The copy is taken before the end-of-replay eviction: eviction cancels the workflow's
    coroutine, and the cancellation path of ``TurnWorkflow.run`` may repair the conversation,
    which must not show on a turn that was never cancelled."""

    def __init__(self) -> None:
        self.workflow: TurnWorkflow | None = None
        self.turn: TurnInput | None = None
        self.frozen: TurnState | None = None
        self._done = False

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        del input
        capture = self

        class _Inbound(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                capture.workflow = workflow.instance()
                capture.turn = _turn_input(input.args)
                return await super().execute_workflow(input)

        return _Inbound

    def freeze(self) -> None:
        if self._done:
            return
        self._done = True
        state = self.workflow._state if self.workflow is not None else None
        self.frozen = state.model_copy(deep=True) if state is not None else None


def _turn_input(args: Sequence[Any]) -> TurnInput | None:
    """The run's ``TurnInput``, which the SDK may hand over as plain JSON (it decodes by type
    hints only when the run gets every argument it declares)."""
    try:
        return TurnInput.model_validate(args[0]) if args else None
    except ValidationError:
        return None  # the workflow fails on it as well, and its failure says why


class _FreezingRunner(WorkflowRunner):
    """The unsandboxed runner, with each instance telling ``capture`` when eviction starts."""

    def __init__(self, capture: _Capture) -> None:
        self._inner = UnsandboxedWorkflowRunner()
        self._capture = capture

    def prepare_workflow(self, defn: Any) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _FreezingInstance(self._inner.create_instance(det), self._capture)

    def set_worker_level_failure_exception_types(
        self, types: Sequence[type[BaseException]]
    ) -> None:
        self._inner.set_worker_level_failure_exception_types(types)


class _FreezingInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, capture: _Capture) -> None:
        self._inner = inner
        self._capture = capture

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        # Replay ends with an eviction (history exhausted, or a replay failure).
        if any(job.HasField("remove_from_cache") for job in act.jobs):
            self._capture.freeze()
        return self._inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> SerializationContext | None:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> StorageDriverStoreContext:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()
