"""The OpenAI-compatible providers fast-agent users most often configure: DeepSeek, OpenRouter,
Groq, xAI and Google (its OpenAI-compatible endpoint), and Azure OpenAI (``azure.py``), each
under fast-agent's config key and model prefix, with its default base URL and its key from the
config block or fast-agent's environment variable (``DEEPSEEK_API_KEY``...). Any other
OpenAI-compatible server is ``generic.<model>`` (``openai.py``).

All speak Chat Completions through the ``openai`` SDK with its retries off, as ``openai.<model>``
does: failures become the same classified errors (a 429 retried after its ``retry-after``, a
401 final), named by the provider's config key, never showing its key.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from temporalio.exceptions import ApplicationError

from turnkeep.config.settings import ProviderSettings, Settings
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import LlmRequest
from turnkeep.fastagent.model_strings import KNOWN_MODELS, ModelRef, Reasoning
from turnkeep.fastagent.model_strings import aliases as model_aliases
from turnkeep.providers.errors import missing_api_key
from turnkeep.providers.openai import OpenAIProvider, sdk_client

if TYPE_CHECKING:
    from openai import AsyncOpenAI


class OpenAICompatibleProvider(OpenAIProvider):
    """One hosted OpenAI-compatible API: ``provider_class`` makes one subclass per row of
    ``COMPATIBLE_APIS``, and Azure's is its own (``azure.py``)."""

    # Set by each subclass: its display name, default endpoint and fast-agent's key variable.
    display_name: ClassVar[str]
    default_base_url: ClassVar[str]
    key_env: ClassVar[str]
    # An environment variable that overrides the default endpoint (fast-agent reads one for
    # some providers), below the config's base_url.
    base_url_env: ClassVar[str | None] = None
    # Compatible servers widely understand only max_tokens, not max_completion_tokens.
    legacy_max_tokens: ClassVar[bool] = True
    # Models turnkeep knows of the provider have a window; any other has none until the config
    # gives one (`<provider>.context_window`).
    context_window: ClassVar[int | None] = None

    def __init__(self, settings: ProviderSettings | None, *, timeout: float | None = None) -> None:
        """``timeout`` fixes the per-request timeout (tests); by default it follows the
        activity's start-to-close timeout."""
        settings = settings or ProviderSettings()
        key = settings.api_key.get_secret_value() if settings.api_key else None
        key = key or os.environ.get(self.key_env)
        if not key:
            raise missing_api_key(self.display_name, f"{self.name}.api_key", self.key_env)
        self._name = self.name
        self._generic = self.legacy_max_tokens
        self._timeout = timeout
        self._key = key
        self.streams = settings.streaming
        self._client = self._sdk_client(settings, key)

    def _sdk_client(self, settings: ProviderSettings, key: str) -> AsyncOpenAI:
        return sdk_client(settings, key, self.base_url(settings))

    @classmethod
    def base_url(cls, settings: ProviderSettings) -> str:
        env = os.environ.get(cls.base_url_env) if cls.base_url_env else None
        return settings.base_url or env or cls.default_base_url

    @classmethod
    def settings_of(cls, settings: Settings) -> ProviderSettings | None:
        block = getattr(settings, cls.name, None)
        return block if isinstance(block, ProviderSettings) else None

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAICompatibleProvider:
        return cls(cls.settings_of(settings))

    @classmethod
    def default_model(cls, settings: Settings) -> str | None:
        # fast-agent picks a default only among its first-party providers; so does turnkeep.
        del settings
        return None

    async def complete_model(self, request: LlmRequest, model: ModelRef) -> Message:
        try:
            return await super().complete_model(request, model)
        except ApplicationError as err:
            if err.type != "ProviderAuthentication":
                raise
            # Which key was refused, by where it came from, not what it is.
            raise ApplicationError(
                f"{err.message} — {self.display_name} refused the API key: check "
                f"`{self.name}.api_key` or {self.key_env} on the worker.",
                type=err.type,
                non_retryable=True,
            ) from None


@dataclass(frozen=True)
class CompatibleApi:
    """One hosted OpenAI-compatible API: a row of ``COMPATIBLE_APIS``."""

    name: str  # fast-agent's config key and model prefix
    # The class's name, which this module binds it to, so it pickles and reads in errors.
    class_name: str
    display_name: str
    base_url: str  # the default endpoint, fast-agent's
    key_env: str  # fast-agent's environment variable for the key
    # An environment variable that overrides the default endpoint, below the config's.
    base_url_env: str | None = None
    # How a model string's reasoning setting is sent, when not as OpenAI's `reasoning_effort`.
    effort: Callable[[Reasoning], str | None] | None = None


def groq_effort(reasoning: Reasoning) -> str | None:
    """Groq takes only ``default`` (thinking on) or ``none``, as fast-agent sends it."""
    off = reasoning.value is False or reasoning.value == "none"
    return "none" if off else "default"


COMPATIBLE_APIS: tuple[CompatibleApi, ...] = (
    CompatibleApi(
        "deepseek", "DeepSeekProvider", "DeepSeek", "https://api.deepseek.com", "DEEPSEEK_API_KEY"
    ),
    # `openrouter.<vendor>/<model>`: OpenRouter's model ids name their vendor.
    CompatibleApi(
        "openrouter",
        "OpenRouterProvider",
        "OpenRouter",
        "https://openrouter.ai/api/v1",
        "OPENROUTER_API_KEY",
        base_url_env="OPENROUTER_BASE_URL",
    ),
    CompatibleApi(
        "groq",
        "GroqProvider",
        "Groq",
        "https://api.groq.com/openai/v1",
        "GROQ_API_KEY",
        effort=groq_effort,
    ),
    CompatibleApi("xai", "XaiProvider", "xAI", "https://api.x.ai/v1", "XAI_API_KEY"),
    # Google's OpenAI-compatible endpoint (fast-agent's `googleoai.` prefix means the same here).
    CompatibleApi(
        "google",
        "GoogleProvider",
        "Google",
        "https://generativelanguage.googleapis.com/v1beta/openai",
        "GOOGLE_API_KEY",
    ),
)


def provider_class(api: CompatibleApi) -> type[OpenAICompatibleProvider]:
    """The provider class of one row, registered like any other provider: fast-agent's aliases
    and known models of its name, and their context windows."""
    namespace: dict[str, Any] = {
        "__doc__": f"``{api.name}.<model>`` on {api.display_name}'s OpenAI-compatible API.",
        "__module__": __name__,
        "__qualname__": api.class_name,
        "name": api.name,
        "display_name": api.display_name,
        "default_base_url": api.base_url,
        "key_env": api.key_env,
        "base_url_env": api.base_url_env,
        "aliases": model_aliases(api.name),
        "context_windows": KNOWN_MODELS.get(api.name, {}),
    }
    if api.effort is not None:
        namespace["effort"] = staticmethod(api.effort)
    return type(api.class_name, (OpenAICompatibleProvider,), namespace)


PROVIDER_CLASSES = {api.name: provider_class(api) for api in COMPATIBLE_APIS}
OPENAI_COMPATIBLE_PROVIDERS = tuple(PROVIDER_CLASSES.values())
# Each class under its own name (its `class_name`), by its key, not by the table's order.
DeepSeekProvider = PROVIDER_CLASSES["deepseek"]
OpenRouterProvider = PROVIDER_CLASSES["openrouter"]
GroqProvider = PROVIDER_CLASSES["groq"]
XaiProvider = PROVIDER_CLASSES["xai"]
GoogleProvider = PROVIDER_CLASSES["google"]
