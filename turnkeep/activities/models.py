"""Model strings → providers (SPEC §5), the way fast-agent spells them.

``passthrough`` and ``playback`` are offline; ``anthropic.<model>``, ``openai.<model>`` and
``generic.<model>`` name a provider and the provider's own model id; ``sonnet``, ``haiku``,
``opus`` and a few OpenAI names are aliases.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from turnkeep.errors import config_error
from turnkeep.settings import AgentSettings, ProviderSettings, Settings

OFFLINE = ("passthrough", "playback")
PROVIDERS = ("anthropic", "openai", "generic")

ALIASES = {
    "sonnet": "anthropic.claude-sonnet-4-5",
    "haiku": "anthropic.claude-haiku-4-5",
    "opus": "anthropic.claude-opus-4-1",
    "gpt-4.1": "openai.gpt-4.1",
    "gpt-4.1-mini": "openai.gpt-4.1-mini",
    "gpt-4o": "openai.gpt-4o",
    "gpt-5": "openai.gpt-5",
    "gpt-5-mini": "openai.gpt-5-mini",
    "o3": "openai.o3",
}


# Context windows in tokens, for deciding when to compact; a config value wins.
CONTEXT_WINDOWS = {
    "anthropic": 200_000,
    "openai": 128_000,
    "openai.gpt-4.1": 1_047_576,
    "openai.gpt-4.1-mini": 1_047_576,
    "openai.gpt-5": 400_000,
    "openai.gpt-5-mini": 400_000,
    "openai.o3": 200_000,
    "generic": 32_768,
    "passthrough": 200_000,
    "playback": 200_000,
}


# What a model call asks for when neither the turn nor its agent sets max_tokens: the Messages
# API requires a value (fast-agent's default for Anthropic models); OpenAI-compatible APIs need
# none and stop at the model's own output limit, as do the offline models.
PROVIDER_MAX_TOKENS = {"anthropic": 4096}


@dataclass(frozen=True)
class ModelRef:
    provider: str  # passthrough | playback | anthropic | openai | generic
    name: str  # the provider's model id ("" for offline models)


def resolve_model(model: str) -> ModelRef:
    spelled = ALIASES.get(model, model)
    if spelled in OFFLINE:
        return ModelRef(provider=spelled, name="")
    provider, _, name = spelled.partition(".")
    if provider in PROVIDERS and name:
        return ModelRef(provider=provider, name=name)
    raise config_error(
        "UnknownModel",
        f"Unknown model {model!r}. Use passthrough, playback, anthropic.<model>, "
        f"openai.<model>, generic.<model> or an alias ({', '.join(sorted(ALIASES))}).",
    )


def default_model(settings: Settings) -> str:
    """fast-agent's precedence: config, then whichever provider has a key, then offline."""
    if settings.default_model:
        return settings.default_model
    if os.environ.get("ANTHROPIC_API_KEY") or (settings.anthropic and settings.anthropic.api_key):
        return "sonnet"
    if os.environ.get("OPENAI_API_KEY") or (settings.openai and settings.openai.api_key):
        return "openai.gpt-4.1-mini"
    return "passthrough"


def allowed_models(settings: Settings, agent: AgentSettings) -> list[str]:
    """The models a turn of ``agent`` may run on: its model (else the worker's default) and
    its ``models``. Both prepare_turn and the model activities hold requests to this."""
    return [agent.model or default_model(settings), *agent.models]


def max_tokens_limit(agent: AgentSettings, model: str) -> int | None:
    """The most output tokens a turn of ``agent`` on ``model`` asks for unless the agent lets
    turns set ``max_tokens``: the agent's own, else the provider's default (None: no limit is
    sent, so the model's own applies and any value is lower)."""
    return agent.max_tokens or PROVIDER_MAX_TOKENS.get(resolve_model(model).provider)


def generic_base_url(settings: ProviderSettings | None) -> str:
    """Where ``generic.<model>`` calls go: only ever the URL the worker's config names, so no
    turn can make the worker open one it doesn't (there is no default, not even localhost)."""
    if settings is None or not settings.base_url:
        raise config_error(
            "ModelNotConfigured",
            "generic.<model> needs `generic: {base_url: ...}` in turnkeep.yaml "
            "(e.g. http://localhost:11434/v1 for Ollama).",
        )
    return settings.base_url


def context_window(model: str) -> int:
    ref = resolve_model(model)
    spelled = f"{ref.provider}.{ref.name}" if ref.name else ref.provider
    return CONTEXT_WINDOWS.get(spelled, CONTEXT_WINDOWS[ref.provider])
