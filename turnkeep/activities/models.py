"""Model strings → providers (SPEC §5), the way fast-agent spells them, through a registry of
provider classes (``turnkeep/activities/providers/__init__.py``).

``passthrough`` and ``playback`` are offline; ``anthropic.<model>``, ``openai.<model>`` and
``generic.<model>`` name a provider and the provider's own model id; ``sonnet``, ``haiku``,
``opus`` and a few OpenAI names are aliases. Other providers come from installed packages
(the ``turnkeep.providers`` entry-point group) or from the worker's plugin
(``TurnkeepPlugin(providers=[...])``). A model string resolves to a registered provider or to
nothing: a turn cannot make a worker load code or reach an API its operator did not install.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from turnkeep.activities.entry_points import register_installed
from turnkeep.activities.providers import ModelProvider
from turnkeep.activities.providers.anthropic import AnthropicProvider
from turnkeep.activities.providers.openai import GenericProvider, OpenAIProvider
from turnkeep.activities.providers.passthrough import PassthroughProvider
from turnkeep.activities.providers.playback import PlaybackProvider
from turnkeep.errors import config_error
from turnkeep.settings import AgentSettings, Settings

ENTRY_POINT_GROUP = "turnkeep.providers"
# In this order: the first whose `default_model` answers is a config's default model.
BUILTIN_PROVIDERS: tuple[type[ModelProvider], ...] = (
    PassthroughProvider,
    PlaybackProvider,
    AnthropicProvider,
    OpenAIProvider,
    GenericProvider,
)


@dataclass(frozen=True)
class ModelRef:
    provider: str  # a registered provider's name
    name: str  # the provider's model id ("" for a bare provider)


class ProviderRegistry:
    """Provider classes by name, and their aliases. Registering is all-or-nothing per class: a
    name or alias another provider has is refused, never silently taken over."""

    def __init__(self, providers: Iterable[type[ModelProvider]] = ()) -> None:
        self._providers: dict[str, type[ModelProvider]] = {}
        self._aliases: dict[str, ModelRef] = {}
        for provider in providers:
            self.register(provider)

    def register(self, provider: type[ModelProvider]) -> None:
        if not (isinstance(provider, type) and issubclass(provider, ModelProvider)):
            raise TypeError(f"{provider!r} is not a ModelProvider subclass")
        name = getattr(provider, "name", "")
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"{provider.__name__}.name must be a non-empty string without '.'")
        known = self._providers.get(name)
        if known is provider:
            return
        if known is not None:
            raise ValueError(
                f"two model providers are named {name!r}: {known.__qualname__} and "
                f"{provider.__qualname__}"
            )
        bare = {p.name for p in self if p.bare} | ({name} if provider.bare else set())
        clashes = sorted(a for a in provider.aliases if a in self._aliases or a in bare)
        if provider.bare and name in self._aliases:
            clashes.append(name)
        if clashes:
            raise ValueError(f"{provider.__qualname__}'s model string(s) {clashes} are taken")
        self._providers[name] = provider
        for alias, model in provider.aliases.items():
            self._aliases[alias] = ModelRef(provider=name, name=model)

    def with_providers(self, providers: Iterable[type[ModelProvider]]) -> ProviderRegistry:
        """This registry and ``providers`` (a worker's own), leaving this one unchanged."""
        registry = ProviderRegistry(self)
        for provider in providers:
            registry.register(provider)
        return registry

    def __iter__(self) -> Iterator[type[ModelProvider]]:
        return iter(self._providers.values())

    def resolve(self, model: str) -> ModelRef:
        ref = self._aliases.get(model)
        if ref is not None:
            return ref
        name, dot, model_id = model.partition(".")
        provider = self._providers.get(name)
        if provider is not None and (not dot if provider.bare else bool(model_id)):
            return ModelRef(provider=name, name=model_id)
        spelled = [p.name if p.bare else f"{p.name}.<model>" for p in self]
        raise config_error(
            "UnknownModel",
            f"Unknown model {model!r}. Use {', '.join(spelled)} or an alias "
            f"({', '.join(sorted(self._aliases))}).",
        )

    def __getitem__(self, name: str) -> type[ModelProvider]:
        """The provider named ``name`` (a ``ModelRef.provider``)."""
        return self._providers[name]

    def check(self, settings: Settings, model: str) -> None:
        """Fail now if ``model`` is unknown, or its provider unusable with ``settings``."""
        self[self.resolve(model).provider].check(settings)

    def default_model(self, settings: Settings) -> str:
        """fast-agent's precedence: config, then whichever provider has a key, then offline."""
        if settings.default_model:
            return settings.default_model
        for provider in self:
            if (model := provider.default_model(settings)) is not None:
                return model
        return PassthroughProvider.name

    def context_window(self, model: str) -> int:
        ref = self.resolve(model)
        provider = self[ref.provider]
        return provider.context_windows.get(ref.name, provider.context_window)

    def max_tokens(self, model: str) -> int | None:
        return self[self.resolve(model).provider].max_tokens


@functools.cache
def installed_providers() -> ProviderRegistry:
    """The built-in providers and those of installed packages, whose distributions declare
    ``[project.entry-points."turnkeep.providers"] myllm = "mypackage.provider:MyProvider"``.
    Loaded once per process; a broken entry point stops the worker with its name."""
    registry = ProviderRegistry(BUILTIN_PROVIDERS)
    register_installed(registry.register, ENTRY_POINT_GROUP, "model provider")
    return registry


def allowed_models(
    settings: Settings, agent: AgentSettings, providers: ProviderRegistry | None = None
) -> list[str]:
    """The models a turn of ``agent`` may run on: its model (else the worker's default) and
    its ``models``. Both prepare_turn and the model activities hold requests to this."""
    registry = providers or installed_providers()
    return [agent.model or registry.default_model(settings), *agent.models]


def max_tokens_limit(
    agent: AgentSettings, model: str, providers: ProviderRegistry | None = None
) -> int | None:
    """The most output tokens a turn of ``agent`` on ``model`` asks for unless the agent lets
    turns set ``max_tokens``: the agent's own, else the provider's default (None: no limit is
    sent, so the model's own applies and any value is lower)."""
    return agent.max_tokens or (providers or installed_providers()).max_tokens(model)
