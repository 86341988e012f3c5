"""Model providers: one class each, answering an ``LlmRequest`` with an assistant ``Message``
(stop reason, tool calls, and a ``usage`` channel).

A provider class declares the model strings it answers (``name.<model>``, or ``name`` alone
for a ``bare`` one, plus ``aliases``) and how it is built from the worker's settings; the
registry (``turnkeep.providers.registry``) resolves model strings to registered classes
only. The built-in providers register the same way a third party's does (the plugin's
``providers=`` or the ``turnkeep.providers`` entry-point group). A provider module must not
import its SDK at the top: registering it, which every worker and ``prepare_turn`` does,
would otherwise load the SDK on workers that never call it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from turnkeep.config.settings import Settings
from turnkeep.contract.messages import Message, json_channel
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.turn_io import Usage
from turnkeep.fastagent.model_strings import ModelRef


class ModelProvider(ABC):
    # The provider's prefix: model strings `name.<model>` (`name` alone when `bare`).
    name: ClassVar[str]
    # The name alone is the model string and there is no `.<model>` (the offline models).
    bare: ClassVar[bool] = False
    # Short model strings (`sonnet`) -> this provider's own model id.
    aliases: ClassVar[Mapping[str, str]] = {}
    # Tokens, for deciding when to compact (a config value wins): per model id, else the
    # default. None: unknown, and turns are not compacted until the config gives a window.
    context_window: ClassVar[int | None] = 128_000
    context_windows: ClassVar[Mapping[str, int]] = {}
    # The kinds of reasoning setting (`?reasoning=high`: "effort", on/off: "toggle", tokens:
    # "budget") `complete_model` takes; a model string with another is refused before any call.
    reasoning: ClassVar[frozenset[str]] = frozenset()
    # What a call asks for when neither the turn nor its agent sets max_tokens; None: nothing
    # is sent and the model's own limit applies.
    max_tokens: ClassVar[int | None] = None
    # ``complete_model`` streams to ``delta_sink()`` when there is one
    # (``turnkeep.providers.streaming``); a provider that doesn't gets no live stream opened.
    # Per instance: a provider whose config block says `streaming: false` sets it off.
    streams: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelProvider:
        """The worker's one instance (it may hold a connection pool). May raise a
        ``config_error`` (no key): the turns that use the provider report it."""
        del settings
        return cls()

    @classmethod
    def check(cls, settings: Settings) -> None:
        """Raise a ``config_error`` if a turn could not use this provider with ``settings``:
        ``prepare_turn`` calls it, so such a turn fails before any model call."""
        del settings

    @classmethod
    def default_model(cls, settings: Settings) -> str | None:
        """The model string a worker whose config names no ``default_model`` uses, if this
        provider should be it (fast-agent's precedence: the first provider with a key)."""
        del settings
        return None

    @abstractmethod
    async def complete(self, request: LlmRequest, model_name: str) -> Message: ...

    async def complete_model(self, request: LlmRequest, model: ModelRef) -> Message:
        """The call the model activities make: ``complete`` with the model's own id, plus its
        reasoning setting for a provider that takes one (it overrides this)."""
        return await self.complete(request, model.name)

    async def aclose(self) -> None:
        """Release connections (at worker shutdown); the default holds none."""
        return None


def with_usage(message: Message, usage: Usage) -> Message:
    """Attach usage the way every provider reports it: as the ``usage`` channel."""
    channels = dict(message.channels or {})
    # A cost is the model activity's to add (``turnkeep.providers.prices``): unknown here.
    channels["usage"] = json_channel(usage.model_dump(exclude={"calls"}, exclude_none=True))
    return message.model_copy(update={"channels": channels})
