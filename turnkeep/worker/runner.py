"""The workflow runner of the workers turnkeep builds (``build_worker``, ``turnkeep worker``):
Temporal's sandbox, with two costs taken out. ``TurnkeepPlugin`` on an application's own worker
adds only the first to the application's runner (``turnkeep/worker/composition.py``): the second
needs a private class of the SDK, which an application chooses for itself (a turn's iteration
took ~11% longer without it, measured interleaved on one dev server).

1. **Passthrough modules.** Modules the sandbox shares across workflow runs instead of
   re-importing them for each run: ``beartype``, because fastmcp's key_value dependency
   installs beartype's import hook process-wide (left sandboxed, every run re-imported beartype
   through it, ~450 ms per new turn), and all of ``workflows``, turnkeep's own workflow code.
   Re-importing that re-ran every module and rebuilt every pydantic model for each turn, and
   where no ``.pyc`` can be written (``PYTHONDONTWRITEBYTECODE``) recompiled the modules too:
   a seventh of a busy worker's CPU (`bench`'s throughput profile). The sandbox's runtime
   checks (no ``datetime.now()``, no I/O...) reach only code imported inside it, so the replay
   tests run every recorded turn history on ``STRICT_WORKFLOW_RUNNER``, which imports all of
   ``workflows`` inside the sandbox: a forbidden call in workflow code fails CI there.
2. **Serialization contexts outside ``exec``.** Before it encodes or decodes a payload, the SDK
   asks the workflow instance which command the payload belongs to (its serialization context
   and external-storage context). The stock sandbox answers each question by compiling and
   ``exec``-ing a snippet inside the sandbox with its import hooks applied: six visits of every
   activation and completion, per payload, made that a fifth of a worker's busy time on a
   quick turn (`bench`'s profile). The answer is a read of the instance's pending-command
   tables with no user code involved, so ``_FastContextInstance`` asks the sandboxed instance
   directly. It relies on two private names of ``temporalio``'s sandbox; when they are not
   there (another SDK version), it falls back to the stock behaviour, and
   ``tests/test_workflow_runner.py`` says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from temporalio.worker import (
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

try:  # private: the sandbox's instance class, to answer context questions without exec
    from temporalio.worker.workflow_sandbox._runner import _Instance
except ImportError:  # pragma: no cover - another SDK version: stock behaviour
    _Instance = None  # type: ignore[assignment,misc]

PASSTHROUGH_MODULES = ("beartype", "turnkeep.workflows")

# The name the stock sandbox binds its in-sandbox instance to, in the globals it execs in.
_IN_SANDBOX = "__temporal_in_sandbox"


if _Instance is not None:

    class _FastContextInstance(_Instance):
        """The sandbox's instance, answering serialization-context questions by a direct call
        on the in-sandbox instance (pure reads of its state) instead of ``exec``."""

        def _in_sandbox(self) -> Any:
            return self.globals_and_locals.get(_IN_SANDBOX)

        def get_serialization_context(self, command_info: Any) -> Any:
            inner = self._in_sandbox()
            if inner is None:
                return super().get_serialization_context(command_info)
            return inner.get_serialization_context(command_info)

        def get_external_store_context(self, command_info: Any) -> Any:
            inner = self._in_sandbox()
            if inner is None:
                return super().get_external_store_context(command_info)
            return inner.get_external_store_context(command_info)


class TurnkeepWorkflowRunner(SandboxedWorkflowRunner):
    """``SandboxedWorkflowRunner`` whose instances answer context questions without exec."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        if _Instance is None:  # pragma: no cover - another SDK version
            return super().create_instance(det)
        return _FastContextInstance(det, self.runner_class, self.restrictions)

    @property
    def fast_contexts(self) -> bool:
        """Whether this SDK version lets the runner skip ``exec`` for contexts."""
        return _Instance is not None


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
