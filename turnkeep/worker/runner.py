"""The workflow runner of the workers turnkeep builds (``build_worker``, ``turnkeep worker``):
Temporal's sandbox, with two costs taken out. ``TurnkeepPlugin`` on an application's own worker
adds only the first to the application's runner (``turnkeep.payloads.composition``): the second
needs a private class of the SDK, which an application chooses for itself (the design notes say
what a turn's iterations pay without it).

1. **Passthrough modules.** Modules the sandbox shares across workflow runs instead of
   re-importing them for each run: ``beartype``, because fastmcp's key_value dependency
   installs beartype's import hook process-wide (left sandboxed, every run re-imported beartype
   through it, a long wait for every new turn), and all of ``workflows`` and ``contract``,
   turnkeep's own workflow code and the types it shares. Re-importing that re-ran every module
   and rebuilt every pydantic model for each turn, and where no ``.pyc`` can be written
   (``PYTHONDONTWRITEBYTECODE``) recompiled the modules too: a large share of a busy worker's
   CPU (`bench`'s throughput profile). The sandbox's runtime checks (no ``datetime.now()``, no
   I/O...) reach only code imported inside it, so the replay tests run every recorded turn
   history on ``STRICT_WORKFLOW_RUNNER``, which imports all of ``workflows`` and ``contract``
   inside the sandbox: a forbidden call in workflow code fails CI there.
2. **Serialization contexts outside ``exec``.** Before it encodes or decodes a payload, the SDK
   asks the workflow instance which command the payload belongs to (its serialization context
   and external-storage context). The stock sandbox answers each question by compiling and
   ``exec``-ing a snippet inside the sandbox with its import hooks applied: six visits of every
   activation and completion, per payload, made that a large share of a worker's busy time on
   a quick turn (`bench`'s profile). The answer is a read of the instance's pending-command
   tables with no user code involved, so the runner's instances ask the sandboxed instance
   directly (``sandboxed_instance``, through private names of the SDK's sandbox); where this
   SDK version lacks them, the runner makes the stock instance.
"""

from __future__ import annotations

import dataclasses

from temporalio.worker import (
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from turnkeep.support.sdk_private import CONTEXTS_WITHOUT_EXEC, sandboxed_instance

PASSTHROUGH_MODULES = ("beartype", "turnkeep.contract", "turnkeep.workflows")


class TurnkeepWorkflowRunner(SandboxedWorkflowRunner):
    """``SandboxedWorkflowRunner`` whose instances answer context questions without exec."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        instance = sandboxed_instance(det, self.runner_class, self.restrictions)
        return instance if instance is not None else super().create_instance(det)

    @property
    def fast_contexts(self) -> bool:
        """Whether this SDK version lets the runner skip ``exec`` for contexts."""
        return CONTEXTS_WITHOUT_EXEC


WORKFLOW_RUNNER = TurnkeepWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
)

# Every workflow module imported inside the sandbox, its restrictions applied: slower per turn,
# for the replay tests (see 1. above).
STRICT_WORKFLOW_RUNNER = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules("beartype")
)


def with_passthrough(existing: WorkflowRunner | None) -> WorkflowRunner:
    """The application's sandbox with turnkeep's workflow code passed through. Another runner
    (no sandbox, or one of its own) is kept as it is."""
    if existing is None:
        return SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
        )
    if not isinstance(existing, SandboxedWorkflowRunner):
        return existing
    if existing.restrictions.passthrough_modules >= set(PASSTHROUGH_MODULES):
        return existing
    restrictions = existing.restrictions.with_passthrough_modules(*PASSTHROUGH_MODULES)
    return dataclasses.replace(existing, restrictions=restrictions)
