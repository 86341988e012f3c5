"""The model activities: `llm_step` (one model call, on whichever provider the model string
names) and `compact_history` (a summary of older exchanges, by the same model)."""

from __future__ import annotations

import contextlib
import sys

from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnkeep.activities.compaction import summary_request
from turnkeep.activities.heartbeat import heartbeating
from turnkeep.activities.model_input import MODEL_INPUTS, model_input
from turnkeep.activities.turn_setup import check_overrides
from turnkeep.config.catalog import AgentCatalog
from turnkeep.config.settings import AgentSettings
from turnkeep.contract.activity_io import COMPACT_HISTORY, LLM_STEP, CompactRequest
from turnkeep.contract.limits_io import RATE_LIMITED
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import (
    LlmRequest,
    LlmStepRequest,
)
from turnkeep.contract.turn_io import TurnOverrides
from turnkeep.errors import require_workflow
from turnkeep.fastagent.model_strings import ModelRef
from turnkeep.observability import spans
from turnkeep.observability.recording import rate_limited
from turnkeep.providers.base import ModelProvider
from turnkeep.providers.prices import with_cost
from turnkeep.providers.registry import ModelCatalog
from turnkeep.providers.streaming import LiveServer, streaming_to


class ModelActivities:
    def __init__(
        self, agents: AgentCatalog, models: ModelCatalog, live: LiveServer | None = None
    ) -> None:
        """``live``: the worker's live-stream server; with it, model calls stream."""
        self._agents = agents
        self._models = models
        self._live = live
        # SDK clients hold connection pools: one instance per provider per worker process.
        self._providers: dict[str, ModelProvider] = {}
        # Build the providers the agents will need now: importing an SDK takes seconds, and
        # doing it inside the first model call would stall every activity on this worker. A
        # provider that can't be built yet (no key) is reported by the turns that use it.
        for ref in self._configured_models():
            with contextlib.suppress(ApplicationError):
                self._provider(ref)

    @activity.defn(name=LLM_STEP)
    async def llm_step(self, step: LlmStepRequest) -> Message:
        require_workflow()
        # Checked before anything is read or connected to: a crafted step must not make this
        # worker an open proxy to the operator's models.
        ref = self._allowed_model(step.agent, step.model)
        request = MODEL_INPUTS.take(step)  # scheduled by a workflow on this worker?
        if request is None:
            # Heartbeat while reading too: after a worker crash the query can wait seconds for
            # the server to give up on the dead worker, and that must not use up this attempt.
            request = await heartbeating(model_input(step), "reading model input")
        # The workflow that answered the query chose the parameters: hold them to the agent.
        agent = self._agents.agent(step.agent)
        overrides = call_overrides(agent, step.model, request)
        check_overrides(self._agents, self._models, step.agent, overrides)
        provider = self._provider(ref)
        spans.model_call(ref.provider, ref.name, request)  # the call's span, when tracing
        try:
            # An agent called inline makes its calls in its caller's workflow: streamed, their
            # text would be followed as the caller's own. Its answer arrives as the tool result.
            live = self._live if step.inline is None else None
            answered = await self._call(provider, request, ref, step.call_index, live)
        except ApplicationError as err:
            if err.type in RATE_LIMITED:
                rate_limited(ref.provider, step.model)
            raise
        answer = with_cost(answered, self._models.price(ref))
        # The ids come from the activity logger; the content stays out of the log.
        activity.logger.info(
            "model call #%d (%s): %s",
            step.call_index,
            step.model,
            answer.stop_reason or "no stop reason",
            extra={"model": step.model},
        )
        return answer

    async def _call(
        self,
        provider: ModelProvider,
        request: LlmRequest,
        ref: ModelRef,
        call_index: int,
        live_server: LiveServer | None,
    ) -> Message:
        if live_server is None or not provider.streams:
            return await heartbeating(provider.complete_model(request, ref), f"llm #{call_index}")
        # Streamed: the provider sends its deltas to this attempt's live stream, whose address
        # is the heartbeat details (every beat's, so none replaces it), sent at once so that
        # watchers find it before the first token. The answer is the same Message.
        converter, attempt = activity.client().data_converter, activity.info().attempt
        try:
            live = await live_server.open(converter, call_index, attempt)
        except Exception as err:  # the live server cannot run: the call goes on, unstreamed
            activity.logger.warning("live streaming is unavailable: %s", err)
            return await heartbeating(provider.complete_model(request, ref), f"llm #{call_index}")
        activity.heartbeat(live.address)
        try:
            with streaming_to(live):
                return await heartbeating(provider.complete_model(request, ref), live.address)
        finally:
            live_server.close(live)

    @activity.defn(name=COMPACT_HISTORY)
    async def compact_history(self, request: CompactRequest) -> Message:
        require_workflow()
        ref = self._allowed_model(request.agent, request.model)
        provider = self._provider(ref)
        summary_call = summary_request(request)
        return await heartbeating(provider.complete_model(summary_call, ref), "compacting")

    async def aclose(self) -> None:
        """Close the SDK clients' connection pools (at worker shutdown)."""
        for provider in self._providers.values():
            await provider.aclose()
        if self._live is not None:
            await self._live.aclose()

    def _configured_models(self) -> list[ModelRef]:
        names = {self._models.default_model()}
        for agent in self._agents.values():
            names.update(self._models.allowed_models(agent))
        refs = []
        for name in sorted(names):
            with contextlib.suppress(ApplicationError):  # reported per turn, with context
                refs.append(self._models.resolve(name))
        return refs

    def _allowed_model(self, agent: str, model: str) -> ModelRef:
        overrides = TurnOverrides.model_construct(model=model)
        check_overrides(self._agents, self._models, agent, overrides)
        return self._models.resolve(model)

    def _provider(self, ref: ModelRef) -> ModelProvider:
        provider = self._providers.get(ref.provider)
        if provider is None:
            provider = self._models.build(ref.provider)
            self._providers[ref.provider] = provider
        return provider


# Larger than any agent's max_tokens: what a model call without one asks for when its agent
# sets one (the provider's default, or no limit at all).
NO_LIMIT = sys.maxsize


def call_overrides(agent: AgentSettings, model: str, request: LlmRequest) -> TurnOverrides:
    """A model call's parameters as the turn overrides they amount to, so the rule that judged
    the turn (``check_overrides``) judges each call. Not validated: odd values a crafted call
    may hold (a negative max_tokens) are the provider's to refuse."""
    return TurnOverrides.model_construct(
        model=model,
        structured_output=request.structured_output,
        temperature=request.temperature,
        max_tokens=request.max_tokens or (None if agent.max_tokens is None else NO_LIMIT),
    )
