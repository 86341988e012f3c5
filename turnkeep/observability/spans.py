"""What the model activity tells the current model-call span, without importing OpenTelemetry:
tracing (``turnkeep.observability.tracing``) sets a hook for the call's duration, and
without it ``model_call`` is one context-variable read."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

from turnkeep.contract.model_io import LlmRequest

# (provider name, model id, the request) -> None
ModelCallHook = Callable[[str, str, LlmRequest], None]

MODEL_CALL_HOOK: ContextVar[ModelCallHook | None] = ContextVar(
    "turnkeep_model_call_hook", default=None
)


def model_call(provider: str, model: str, request: LlmRequest) -> None:
    """Called by ``llm_step`` once it has the request and knows its provider."""
    hook = MODEL_CALL_HOOK.get()
    if hook is not None:
        hook(provider, model, request)
