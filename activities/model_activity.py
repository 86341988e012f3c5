"""The model activities: `llm_step` (one model call, on whichever provider the model string
names) and `compact_history` (a summary of older exchanges, by the same model)."""

from __future__ import annotations

import contextlib

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.compaction import summary_request
from activities.errors import config_error
from activities.heartbeat import heartbeating
from activities.models import PROVIDERS, ModelRef, default_model, resolve_model
from activities.providers import ModelProvider
from activities.providers.passthrough import PassthroughProvider
from activities.providers.playback import PlaybackProvider
from activities.settings import Settings
from workflows.activity_io import (
    COMPACT_HISTORY,
    LLM_STEP,
    MODEL_INPUT_QUERY,
    CompactRequest,
    LlmRequest,
    LlmStepRequest,
    ModelInputPage,
    digest,
)
from workflows.messages import Message


class ModelActivities:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # SDK clients hold connection pools: one per provider per worker process.
        self._providers: dict[str, ModelProvider] = {"passthrough": PassthroughProvider()}
        # Build the SDK clients the agents will need now: importing an SDK takes seconds, and
        # doing it inside the first model call would stall every activity on this worker. A
        # provider that can't be built yet (no key) is reported by the turns that use it.
        for ref in self._configured_models():
            if ref.provider in PROVIDERS and ref.provider not in self._providers:
                with contextlib.suppress(ApplicationError):
                    self._providers[ref.provider] = self._make_sdk_provider(ref.provider)

    @activity.defn(name=LLM_STEP)
    async def llm_step(self, step: LlmStepRequest) -> Message:
        ref = resolve_model(step.model)
        provider = self._provider(ref, step.agent)
        # Heartbeat while reading too: after a worker crash the query can wait seconds for the
        # server to give up on the dead worker, and that must not use up this attempt.
        request = await heartbeating(model_input(step), "reading model input")
        return await heartbeating(provider.complete(request, ref.name), f"llm #{step.call_index}")

    @activity.defn(name=COMPACT_HISTORY)
    async def compact_history(self, request: CompactRequest) -> Message:
        ref = resolve_model(request.model)
        provider = self._provider(ref, request.agent)
        summary_call = summary_request(request)
        return await heartbeating(provider.complete(summary_call, ref.name), "compacting")

    async def aclose(self) -> None:
        """Close the SDK clients' connection pools (at worker shutdown)."""
        for provider in self._providers.values():
            await provider.aclose()

    def _configured_models(self) -> list[ModelRef]:
        names = {default_model(self._settings)}
        for agent in self._settings.agents.values():
            names.update(m for m in [agent.model, *agent.models] if m)
        refs = []
        for name in sorted(names):
            with contextlib.suppress(ApplicationError):  # reported per turn, with context
                refs.append(resolve_model(name))
        return refs

    def _provider(self, ref: ModelRef, agent: str) -> ModelProvider:
        if ref.provider == "playback":
            script = self._settings.agents[agent].playback
            if script is None:
                raise config_error(
                    "UnknownModel", f"agent {agent!r} uses playback but names no playback script"
                )
            return PlaybackProvider(self._settings.path(script))
        if ref.provider not in self._providers:
            self._providers[ref.provider] = self._make_sdk_provider(ref.provider)
        return self._providers[ref.provider]

    def _make_sdk_provider(self, provider: str) -> ModelProvider:
        # Imported here so a worker that only runs offline models never loads the SDKs.
        if provider == "anthropic":
            from activities.providers.anthropic import AnthropicProvider

            return AnthropicProvider(self._settings.anthropic)
        from activities.providers.openai import OpenAIProvider

        if provider == "generic":
            return OpenAIProvider(self._settings.generic, generic=True)
        return OpenAIProvider(self._settings.openai, generic=False)


async def model_input(step: LlmStepRequest) -> LlmRequest:
    """The request the workflow means, read from it by query (page by page) and checked
    against the digest."""
    handle = activity.client().get_workflow_handle(step.workflow_id, run_id=step.run_id)

    async def page(start: int) -> ModelInputPage:
        answer = await handle.query(
            MODEL_INPUT_QUERY, args=[step.call_index, start], result_type=ModelInputPage
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
    if digest(request) != step.digest:
        raise _input_mismatch(step)
    return request


def _input_mismatch(step: LlmStepRequest) -> ApplicationError:
    return ApplicationError(
        f"The workflow no longer holds the input of model call #{step.call_index}.",
        type="ModelInputMismatch",
        non_retryable=True,
    )
