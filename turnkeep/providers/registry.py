"""Model strings → providers (the documentation's *Models*), the way fast-agent spells them,
through a registry of ``ModelProvider`` classes.

``passthrough``, ``playback`` and ``recorded`` (a replay's recorded answers) are offline;
``anthropic.<model>``, ``openai.<model>``, ``generic.<model>``, ``deepseek.``,
``openrouter.``, ``groq.``, ``xai.``, ``google.`` and ``azure.<model>`` name a provider and
the provider's own model id; fast-agent's aliases (``sonnet``, ``gpt-5.5``...) and known
model names (``gpt-5-mini``) name both, and a ``?reasoning=`` setting may follow
(``turnkeep.fastagent.model_strings``). Other providers come
from installed packages (the ``turnkeep.providers`` entry-point group) or from the worker's
plugin (``TurnkeepPlugin(providers=[...])``). A model string resolves to a registered provider
or to nothing: a turn cannot make a worker load code or reach an API its operator did not
install.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

from temporalio.exceptions import ApplicationError

from turnkeep.config.settings import AgentSettings, Settings
from turnkeep.errors import config_error
from turnkeep.fastagent.model_strings import PREFIX_ALIASES, ModelRef, split_model_string
from turnkeep.providers.anthropic import AnthropicProvider
from turnkeep.providers.azure import AzureProvider
from turnkeep.providers.base import ModelProvider
from turnkeep.providers.openai import GenericProvider, OpenAIProvider
from turnkeep.providers.openai_compat import OPENAI_COMPATIBLE_PROVIDERS
from turnkeep.providers.passthrough import PassthroughProvider
from turnkeep.providers.playback import PlaybackProvider
from turnkeep.providers.prices import ModelPrice, Price, builtin_price
from turnkeep.providers.recorded import RecordedProvider
from turnkeep.support.registry import Registry

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "turnkeep.providers"
# In this order: the first whose `default_model` answers is a config's default model.
BUILTIN_PROVIDERS: tuple[type[ModelProvider], ...] = (
    PassthroughProvider,
    PlaybackProvider,
    RecordedProvider,
    AnthropicProvider,
    OpenAIProvider,
    GenericProvider,
    *OPENAI_COMPATIBLE_PROVIDERS,
    AzureProvider,
)

__all__ = ["ModelCatalog", "ModelRef", "ProviderRegistry", "installed_providers"]


class ProviderRegistry(Registry[ModelProvider]):
    """Provider classes by name, and their aliases. Registering is all-or-nothing per class: a
    name or alias another provider has is refused, never silently taken over."""

    base = ModelProvider
    key = "name"
    what = "model provider"
    share = "are named"
    forbidden = "."

    def __init__(self, providers: Iterable[type[ModelProvider]] = ()) -> None:
        self._aliases: dict[str, ModelRef] = {}
        super().__init__(providers)

    def _admit(self, provider: type[ModelProvider], name: str) -> None:
        bare = {p.name for p in self if p.bare} | ({name} if provider.bare else set())
        clashes = sorted(a for a in provider.aliases if a in self._aliases or a in bare)
        if provider.bare and name in self._aliases:
            clashes.append(name)
        if clashes:
            raise ValueError(f"{provider.__qualname__}'s model string(s) {clashes} are taken")
        # An alias may carry a reasoning default (fast-agent's `gpt-5.5?reasoning=medium`).
        aliases: dict[str, ModelRef] = {}
        for alias, model in provider.aliases.items():
            model_id, reasoning, _ = split_model_string(model)
            aliases[alias] = ModelRef(provider=name, name=model_id, reasoning=reasoning)
        self._aliases.update(aliases)

    def resolve(self, model: str) -> ModelRef:
        """What ``model`` names, parsed as fast-agent parses it (``model_strings``): an alias
        or known model name, ``provider.model`` or ``provider/model``, and its reasoning
        setting (``?reasoning=``, or the older ``.low`` suffix)."""
        spec, queried, suffix = split_model_string(model)
        ref = self._aliases.get(spec)
        # A last `.low` is the older reasoning suffix when the rest names a model (as fast-agent
        # did, even for `provider.model.low`), else part of the name.
        if ref is None and suffix is not None:
            ref = self._lookup(spec.rpartition(".")[0])
        if ref is None or spec in self._aliases:
            suffix = None
            ref = ref or self._lookup(spec)
        if ref is None:
            spelled = [p.name if p.bare else f"{p.name}.<model>" for p in self]
            raise config_error(
                "UnknownModel",
                f"Unknown model {model!r}. Use {', '.join(spelled)}, a model name or an alias "
                f"({', '.join(sorted(a for a in self._aliases if a != self._aliases[a].name))}).",
            )
        if queried is not None and suffix is not None:
            raise config_error(
                "InvalidModel", f"Model {model!r} gives its reasoning twice (suffix and query)."
            )
        reasoning = queried or suffix or ref.reasoning
        kinds = self[ref.provider].reasoning
        if reasoning is not None and reasoning.kind not in kinds:
            takes = f"only {' or '.join(sorted(kinds))} settings" if kinds else "no setting"
            raise config_error(
                "InvalidModel",
                f"Model {model!r}: the {ref.provider} provider takes {takes} for reasoning, "
                f"not {reasoning.kind} {reasoning}.",
            )
        return ModelRef(provider=ref.provider, name=ref.name, reasoning=reasoning)

    def _lookup(self, spec: str) -> ModelRef | None:
        if (ref := self._aliases.get(spec)) is not None:
            return ref
        # fast-agent's `provider/model` first, then `provider.model`.
        for separator in ("/", "."):
            name, sep, model_id = spec.partition(separator)
            provider = self.get(PREFIX_ALIASES.get(name, name))
            if sep and provider is not None and not provider.bare and model_id:
                return ModelRef(provider=provider.name, name=model_id)
        provider = self.get(spec)
        if provider is not None and provider.bare:
            return ModelRef(provider=spec, name="")
        return None

    def same_model(self, a: str, b: str) -> bool:
        """Whether two model strings name the same model (reasoning setting included)."""
        try:
            return self.resolve(a) == self.resolve(b)
        except ApplicationError:
            return False

    def context_window(self, model: str) -> int | None:
        """The model's context window in tokens, as its provider knows it (None: unknown).
        ``ModelCatalog.context_window`` puts the config's over it."""
        ref = self.resolve(model)
        provider = self[ref.provider]
        return provider.context_windows.get(ref.name, provider.context_window)

    def max_tokens(self, model: str) -> int | None:
        return self[self.resolve(model).provider].max_tokens


class ModelCatalog:
    """The models a worker's settings make usable: its provider registry, bound to the
    settings its providers are built and checked with. The model activities and
    ``prepare_turn`` share it, so a turn and each of its model calls are held to one rule.

    It holds the whole ``Settings`` on purpose: ``ModelProvider.from_settings``, ``check`` and
    ``default_model`` are extension points documented for third parties, and take them whole (a
    provider reads its own block, ``playback`` the agents' scripts). Besides handing them to
    providers, it reads only ``default_model`` and the provider blocks' ``context_window``."""

    def __init__(self, settings: Settings, registry: ProviderRegistry | None = None) -> None:
        self.registry = registry or installed_providers()
        self._settings = settings
        # The config's prices by what their model strings name (a reasoning setting aside:
        # it changes how many tokens a call takes, not what one costs).
        self._prices: dict[tuple[str, str], ModelPrice] = {}
        for model, price in settings.prices.items():
            try:
                ref = self.resolve(model)
            except ApplicationError:  # a model no provider answers: no call will cost it
                log.warning("prices: unknown model %r is left out", model)
                continue
            self._prices[(ref.provider, ref.name)] = ModelPrice(
                price.input, price.output, price.cache_read, price.cache_write
            )
        self._limits = _limit_entries(self.registry, settings)

    def limit_of(self, model: str) -> str | None:
        """The ``limits:`` entry that governs calls of ``model``: the model's own (however it
        is spelled there), else its provider's; None: the model has no limit."""
        if not self._limits:
            return None
        ref = self.resolve(model)
        return self._limits.get((ref.provider, ref.name)) or self._limits.get((ref.provider, None))

    def price(self, ref: ModelRef) -> Price | None:
        """What a call of ``ref`` costs: the config's price, else turnkeep's own (None:
        unknown)."""
        return self._prices.get((ref.provider, ref.name)) or builtin_price(ref.provider, ref.name)

    def resolve(self, model: str) -> ModelRef:
        return self.registry.resolve(model)

    def build(self, provider: str) -> ModelProvider:
        """A new instance of the provider named ``provider``, built from the settings (it may
        raise a ``config_error``: no key)."""
        return self.registry[provider].from_settings(self._settings)

    def check(self, model: str) -> None:
        """Fail now if ``model`` is unknown, or its provider unusable with the settings."""
        self.registry[self.resolve(model).provider].check(self._settings)

    def default_model(self) -> str:
        """fast-agent's precedence: config, then whichever provider has a key, then offline."""
        if self._settings.default_model:
            return self._settings.default_model
        for provider in self.registry:
            if (model := provider.default_model(self._settings)) is not None:
                return model
        return PassthroughProvider.name

    def allowed_models(self, agent: AgentSettings) -> list[str]:
        """The models a turn of ``agent`` may run on: its model (else the worker's default), its
        fallback models and its ``models``. Both prepare_turn and the model activities hold
        requests to this."""
        return [agent.model or self.default_model(), *agent.fallback_models, *agent.models]

    def is_allowed(self, model: str, allowed: Iterable[str]) -> bool:
        """Whether ``model`` is one of ``allowed``, comparing what they name, not how they are
        spelled: ``sonnet`` is ``anthropic.claude-sonnet-5``, ``o3.high`` is
        ``openai.o3?reasoning=high``, and a reasoning setting is part of the model, so a turn
        can't raise its effort past what the agent lists."""
        return any(model == a or self.registry.same_model(model, a) for a in allowed)

    def max_tokens_limit(self, agent: AgentSettings, model: str) -> int | None:
        """The most output tokens a turn of ``agent`` on ``model`` asks for unless the agent
        lets turns set ``max_tokens``: the agent's own, else the provider's default (None: no
        limit is sent, so the model's own applies and any value is lower)."""
        return agent.max_tokens or self.registry.max_tokens(model)

    def context_window(self, model: str) -> int | None:
        """The model's context window in tokens: its provider block's ``context_window`` when
        the config gives one, else the provider's for the model. None: unknown, and then a
        turn gets no automatic compaction (an agent's ``compaction.context_window`` still
        sets one)."""
        provider = self.resolve(model).provider
        configured = getattr(getattr(self._settings, provider, None), "context_window", None)
        if isinstance(configured, int):
            return configured
        return self.registry.context_window(model)

    def unknown_context_windows(self, agents: Iterable[AgentSettings]) -> dict[str, str]:
        """The models of ``agents`` whose context window turnkeep does not know and the config
        does not give (their turns get no automatic compaction), each once, with their
        provider's name."""
        unknown: dict[str, str] = {}
        for agent in agents:
            if not agent.compaction.enabled or agent.compaction.context_window:
                continue
            for model in self.allowed_models(agent):
                try:
                    if self.context_window(model) is None:
                        unknown[model] = self.resolve(model).provider
                except ApplicationError:  # an unknown model: its turns say so
                    continue
        return unknown


def _limit_entries(
    registry: ProviderRegistry, settings: Settings
) -> dict[tuple[str, str | None], str]:
    """The config's limits by what they name: (provider, model id) for a model's entry,
    (provider, None) for a provider's. An entry that names neither stops the worker: a limit
    that silently governs nothing would let the fleet run past the provider's."""
    entries: dict[tuple[str, str | None], str] = {}
    for name in settings.limits:
        provider = registry.get(name)
        if provider is not None:
            target: tuple[str, str | None] = (provider.name, None)
        else:
            try:
                ref = registry.resolve(name)
            except ApplicationError:
                providers = ", ".join(p.name for p in registry)
                raise ValueError(
                    f"limits: {name!r} names no model or provider this worker knows (a model "
                    f"string such as `openai.gpt-4.1`, or a provider: {providers})"
                ) from None
            target = (ref.provider, ref.name)
        if target in entries:
            raise ValueError(f"limits: {entries[target]!r} and {name!r} name the same model")
        entries[target] = name
    return entries


@functools.cache
def installed_providers() -> ProviderRegistry:
    """The built-in providers and those of installed packages, whose distributions declare
    ``[project.entry-points."turnkeep.providers"] myllm = "mypackage.provider:MyProvider"``.
    Loaded once per process; a broken entry point stops the worker with its name."""
    return ProviderRegistry(BUILTIN_PROVIDERS).register_installed(ENTRY_POINT_GROUP)


def announce_unknown_context_windows(models: dict[str, str]) -> None:
    """One line per model at worker start: compaction is off for it until a window is set."""
    for model, provider in models.items():
        log.warning(
            "model %r: context window unknown, so its turns are not compacted automatically; "
            "set `%s.context_window` (tokens) or the agent's `compaction.context_window`",
            model,
            provider,
        )
