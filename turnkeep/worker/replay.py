"""Replaying turn and session histories as turnkeep's workers run them: ``turnkeep show``,
reading a closed turn, and the replay tests."""

from __future__ import annotations

from temporalio.converter import ExternalStorage
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    WorkflowRunner,
)

from turnkeep.config.settings import Settings
from turnkeep.payloads.codec import payload_codec
from turnkeep.payloads.composition import data_converter
from turnkeep.payloads.limits import result_size_guard
from turnkeep.payloads.storage import external_storage
from turnkeep.worker.runner import WORKFLOW_RUNNER
from turnkeep.workflows.session_workflow import SessionWorkflow
from turnkeep.workflows.turn_workflow import TurnWorkflow


def replay_plugin(
    settings: Settings | None = None,
    *,
    storage: ExternalStorage | None = None,
    workflow_runner: WorkflowRunner = WORKFLOW_RUNNER,
) -> SimplePlugin:
    """What a ``Replayer`` needs to replay turn and session histories: the workflows, runner,
    converter (with the workers' payload storage and encryption keys, to read offloaded and
    encrypted payloads) and interceptors. The replay tests pass ``STRICT_WORKFLOW_RUNNER``."""
    settings = settings or Settings()
    if storage is None:
        storage = external_storage(settings.payload_storage, settings.base_dir)
    return SimplePlugin(
        "turnkeep-replay",
        data_converter=data_converter(storage, payload_codec(settings.encryption)),
        workflows=[TurnWorkflow, SessionWorkflow],
        workflow_runner=workflow_runner,
        interceptors=result_size_guard(storage),
    )
