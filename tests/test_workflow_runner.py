"""turnkeep's workflow runner (``turnkeep.worker.runner``) answers the SDK's
serialization-context questions without ``exec``: the same answers as Temporal's stock sandbox,
checked by recording every context a payload codec is given under each runner."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.worker import Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from tests.context_workflow import ContextWorkflow, echo
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.worker.runner import STRICT_WORKFLOW_RUNNER, WORKFLOW_RUNNER


@dataclass
class RecordingCodec(PayloadCodec, WithSerializationContext):
    """Passes payloads through and records, per encode/decode, the context it was bound to."""

    seen: list[str] = field(default_factory=list)
    context: SerializationContext | None = None

    def with_context(self, context: SerializationContext) -> RecordingCodec:
        return RecordingCodec(self.seen, context)

    def _record(self, op: str) -> None:
        match self.context:
            case ActivitySerializationContext(activity_type=kind, is_local=local):
                self.seen.append(f"{op} activity {kind} local={local}")
            case WorkflowSerializationContext():
                self.seen.append(f"{op} workflow")
            case other:
                self.seen.append(f"{op} {type(other).__name__}")

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self._record("encode")
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self._record("decode")
        return list(payloads)


async def contexts_seen(temporal: ServerInfo, runner: WorkflowRunner) -> list[str]:
    codec = RecordingCodec()
    client = await Client.connect(
        temporal.address,
        namespace=temporal.namespace,
        data_converter=DataConverter(payload_codec=codec),
    )
    queue = f"runner-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ContextWorkflow],
        activities=[echo],
        workflow_runner=runner,
    ):
        result = await client.execute_workflow(
            ContextWorkflow.run, "hi", id=f"ctx-{queue}", task_queue=queue
        )
    assert result == ["hi 0", "hi 1", "hi local"]
    return codec.seen


async def test_contexts_match_the_stock_sandbox(temporal: ServerInfo) -> None:
    stock = SandboxedWorkflowRunner(restrictions=WORKFLOW_RUNNER.restrictions)
    expected = await contexts_seen(temporal, stock)
    assert await contexts_seen(temporal, WORKFLOW_RUNNER) == expected
    # What makes the comparison meaningful: activity-bound contexts were asked for.
    assert "encode activity echo local=False" in expected
    assert "encode activity echo local=True" in expected


def test_replays_import_workflow_code_inside_the_sandbox() -> None:
    # Workers share turnkeep's workflow modules across runs; the replay tests must not, or a
    # forbidden call in workflow code would go unnoticed (``turnkeep.worker.runner``).
    # By its full name only: a Temporal app's own `workflows` module stays sandboxed.
    assert set(WORKFLOW_RUNNER.restrictions.passthrough_modules) >= {
        "turnkeep.contract",
        "turnkeep.workflows",
    }
    assert not {"workflows", "turnkeep"} & set(WORKFLOW_RUNNER.restrictions.passthrough_modules)
    strict = STRICT_WORKFLOW_RUNNER.restrictions.passthrough_modules
    assert not any(m.startswith("turnkeep") for m in strict)
