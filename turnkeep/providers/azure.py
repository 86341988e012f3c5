"""Azure OpenAI (``azure.<deployment>``), as fast-agent's ``azure:`` block configures it.

Calls go to ``https://<resource_name>.openai.azure.com/openai/deployments/<deployment>/
chat/completions?api-version=<api_version>`` (or under the block's ``base_url``), with the key
in Azure's ``api-key`` header. The model string's id is the deployment; ``azure`` alone means
the block's ``azure_deployment``, as in fast-agent. Only API-key authentication: fast-agent's
``use_default_azure_credential`` (Entra ID) is not supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from turnkeep.config.settings import AzureSettings, ProviderSettings, Settings
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import LlmRequest
from turnkeep.errors import config_error
from turnkeep.fastagent.model_strings import ModelRef
from turnkeep.providers.openai_compat import OpenAICompatibleProvider

if TYPE_CHECKING:
    from openai import AsyncOpenAI

# fast-agent's default.
DEFAULT_API_VERSION = "2024-10-21"


class AzureProvider(OpenAICompatibleProvider):
    name = "azure"
    display_name = "Azure OpenAI"
    default_base_url = ""  # per resource: see endpoint()
    key_env = "AZURE_API_KEY"
    # `azure` alone: the configured deployment.
    aliases: ClassVar[Mapping[str, str]] = {"azure": ""}
    context_windows: ClassVar[Mapping[str, int]] = {}
    # Azure OpenAI is OpenAI's API: max_completion_tokens, as openai.<model> sends it.
    legacy_max_tokens: ClassVar[bool] = False

    def __init__(self, settings: ProviderSettings | None, *, timeout: float | None = None) -> None:
        settings = settings or AzureSettings()
        super().__init__(settings, timeout=timeout)
        self._deployment = getattr(settings, "azure_deployment", None)

    def _sdk_client(self, settings: ProviderSettings, key: str) -> AsyncOpenAI:
        from openai import AsyncAzureOpenAI

        return AsyncAzureOpenAI(
            api_key=key,
            azure_endpoint=endpoint(settings),
            api_version=getattr(settings, "api_version", None) or DEFAULT_API_VERSION,
            max_retries=0,  # Temporal's retry policy does the retrying
            default_headers=settings.default_headers,
        )

    @classmethod
    def check(cls, settings: Settings) -> None:
        endpoint(settings.azure)

    async def complete_model(self, request: LlmRequest, model: ModelRef) -> Message:
        deployment = model.name or self._deployment
        if not deployment:
            raise config_error(
                "ModelNotConfigured",
                "Model `azure` needs `azure: {azure_deployment: ...}` in the worker's config; "
                "or name the deployment: azure.<deployment>.",
            )
        # The SDK puts the model, as the deployment, in the URL.
        return await super().complete_model(
            request, ModelRef(self.name, deployment, model.reasoning)
        )


def endpoint(settings: ProviderSettings | None) -> str:
    """The resource's endpoint: ``base_url``, else the one ``resource_name`` names. Only the
    config's: no turn can point the worker elsewhere."""
    base_url = settings.base_url if settings else None
    resource = getattr(settings, "resource_name", None)
    if base_url:
        return base_url
    if resource:
        return f"https://{resource}.openai.azure.com"
    raise config_error(
        "ModelNotConfigured",
        "azure.<deployment> needs `azure: {resource_name: ...}` (or `base_url`) in the worker's "
        "config.",
    )
