"""How ``llm_step`` gets the request it sends: the workflow schedules a reference
(``LlmStepRequest``), never a copy of the conversation. On the worker that scheduled the call,
the model-input hand-off (an interceptor) keeps the request's JSON in memory and the activity
takes it from there; anywhere else, after a restart or on another worker, the activity reads it
from the running workflow by query, page by page. Either way the digest must match, so the
activity sends exactly what the workflow meant."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from turnkeep.contract.activity_io import LLM_STEP
from turnkeep.contract.model_io import (
    MODEL_INPUT_QUERY,
    LlmRequest,
    LlmStepRequest,
    ModelInputPage,
    RequestJson,
    request_digest,
)
from turnkeep.providers.parsed_messages import PARSED_MESSAGES, ParsedMessages


async def model_input(step: LlmStepRequest) -> LlmRequest:
    """The request the workflow means, read from it by query (page by page) and checked
    against the digest."""
    handle = activity.client().get_workflow_handle(step.workflow_id, run_id=step.run_id)

    async def page(start: int) -> ModelInputPage:
        answer = await handle.query(
            MODEL_INPUT_QUERY,
            args=[step.call_index, start] + ([step.inline] if step.inline else []),
            result_type=ModelInputPage,
        )
        if answer is None:
            raise _input_mismatch(step)
        activity.heartbeat(f"reading model input from message {start}")
        return answer

    first = await page(0)
    messages = list(first.request.messages)
    while len(messages) < first.total_messages:
        messages += (await page(len(messages))).request.messages
    request = first.request.model_copy(update={"messages": messages})
    # A mismatch can only be a bug (or a changed workflow): never send the model something else.
    if request_digest(request) != step.digest:
        raise _input_mismatch(step)
    return request


def _input_mismatch(step: LlmStepRequest) -> ApplicationError:
    return ApplicationError(
        f"The workflow no longer holds the input of model call #{step.call_index}.",
        type="ModelInputMismatch",
        non_retryable=True,
    )


HANDOFF_MAX_BYTES = 32 * 1024 * 1024


class ModelInputHandoff:
    """Requests of scheduled model calls, as the JSON their digest is taken over, until
    `llm_step` takes them. Bounded: entries nobody takes here (the call ran on another worker,
    or the turn was cancelled first) are dropped oldest first beyond ``max_bytes``."""

    def __init__(
        self, max_bytes: int = HANDOFF_MAX_BYTES, parsed: ParsedMessages = PARSED_MESSAGES
    ) -> None:
        self._max_bytes = max_bytes
        self._parsed = parsed
        self._bytes = 0
        # (workflow id, run id, call index) -> (digest, request JSON)
        self._entries: OrderedDict[tuple[str, str, int, str | None], tuple[str, RequestJson]] = (
            OrderedDict()
        )
        # Workflow tasks run on the worker's thread pool, activities on its event loop.
        self._lock = threading.Lock()

    def offer(self, step: LlmStepRequest) -> None:
        """Keep ``step``'s request if this process built the step (it has the JSON)."""
        request_json = step.pop_request_json()
        size = request_json.chars() if request_json is not None else 0
        if request_json is None or size > self._max_bytes:
            return
        with self._lock:
            key = _key(step)
            old = self._entries.pop(key, None)
            self._bytes += size - (old[1].chars() if old is not None else 0)
            self._entries[key] = (step.digest, request_json)
            while self._bytes > self._max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped.chars()

    def take(self, step: LlmStepRequest) -> LlmRequest | None:
        """The request of ``step`` if it was offered here and matches the digest, else None."""
        with self._lock:
            entry = self._entries.pop(_key(step), None)
            if entry is not None:
                self._bytes -= entry[1].chars()
        # The offered digest was taken over this JSON when the workflow built the step, so
        # equal digests mean the JSON is exactly what the query would have returned.
        if entry is None or entry[0] != step.digest:
            return None
        return entry[1].parse(self._parsed.messages)


def _key(step: LlmStepRequest) -> tuple[str, str, int, str | None]:
    return (step.workflow_id, step.run_id, step.call_index, step.inline)


# One per process: the workflow and the activity may belong to different Worker objects of one
# process (the digest check makes sharing safe).
MODEL_INPUTS = ModelInputHandoff()


class ModelInputHandoffInterceptor(Interceptor):
    """Offers each `llm_step`'s request to ``MODEL_INPUTS`` as the workflow schedules it."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        del input
        return _HandoffInbound


class _HandoffInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_HandoffOutbound(outbound))


class _HandoffOutbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> Any:
        # Not while replaying: those calls have run already, nobody would take their input.
        # (Offering issues no command, so replay is unaffected either way.)
        if input.activity == LLM_STEP and not workflow.unsafe.is_replaying():
            step = input.args[0] if input.args else None
            if isinstance(step, LlmStepRequest):
                MODEL_INPUTS.offer(step)
        return super().start_activity(input)
