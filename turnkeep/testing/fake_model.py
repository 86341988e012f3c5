"""Scripted model answers, one script per agent, for testing agents without a real model.

Each agent is given a model string of its own (``fake.model("researcher")`` is
``anthropic.researcher``), and the worker's ``anthropic`` and ``openai`` blocks point at a
``FakeModelApi`` on loopback with a key that is not a real one. A turn's model calls then go
through turnkeep's real provider adapter and the real SDK, over HTTP, to the fake API, which
answers each model id from its own script::

    fake.script(
        "researcher",
        Reply.tool_calls(("call_1", "researcher__lookup", {"topic": "otters"})),
        Reply.text("Otters hold hands while they sleep."),
    )
    agent = Agent(name="researcher", model=fake.model("researcher"), tools=[lookup])

A step is any ``Reply``: text, tool calls, an API error (429 and 5xx are retried as a real
provider's would be, 400 fails the call at once), a delay, a dropped connection.
"""

from __future__ import annotations

import re
from typing import TypeVar

from pydantic import SecretStr

from turnkeep.config.settings import AnthropicSettings, ProviderSettings, Settings
from turnkeep.providers.registry import ModelCatalog
from turnkeep.support.lifecycle import StartStop
from turnkeep.testing.fake_api import Api, FakeModelApi, Recorded, Step

# What the SDKs send as the key: never a real one, so nothing a test does can reach a real API
# with it, and a leak of it in a test's output means nothing.
FAKE_API_KEY = "sk-turnkeep-fake-model-key"

# A name becomes a model id: a `.`, `/` or `?` in it would be read as part of the model string
# (a reasoning suffix, a provider path, a query).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class FakeModel(StartStop["FakeModel"]):
    """Per-agent scripts on a ``FakeModelApi``. ``FakeModel()`` starts an API of its own (use
    it as a context manager, or ``start()`` and ``stop()``); ``FakeModel(api)`` shares a
    running one and leaves it running. ``provider`` is the API the model strings go by:
    ``anthropic`` (the Messages API) or ``openai`` (Chat Completions)."""

    def __init__(self, api: FakeModelApi | None = None, *, provider: Api = "anthropic") -> None:
        if provider not in ("anthropic", "openai"):
            raise ValueError(f"provider must be 'anthropic' or 'openai', not {provider!r}")
        self._owns_api = api is None
        self.api = api if api is not None else FakeModelApi()
        self.provider: Api = provider

    def model(self, name: str) -> str:
        """The model string of the agent whose script is ``name`` (``anthropic.<name>``)."""
        if not _NAME.match(name):
            raise ValueError(f"a fake model's name is letters, digits, '-' and '_', not {name!r}")
        return f"{self.provider}.{name}"

    def script(self, name: str, *steps: Step) -> str:
        """Append ``steps`` to ``name``'s script: its model's next requests get them, one each,
        in order; a request past the end gets a 400, which fails the model call. Returns the
        model string (``model(name)``)."""
        model = self.model(name)
        self.api.script(*steps, model=name)
        return model

    def pending(self, name: str) -> int:
        """How many of ``name``'s steps no request has used yet."""
        return self.api.pending(model=name)

    def requests(self, name: str) -> list[Recorded]:
        """The requests ``name``'s model got, in order (their JSON bodies, as the SDK sent
        them)."""
        return self.api.requests_for_model(name)

    def reset(self) -> None:
        """Forget every script and recorded request."""
        self.api.reset()

    def configure(self, settings: Settings) -> Settings:
        """``settings`` with the ``anthropic`` and ``openai`` blocks pointing at the fake API
        (their other keys kept): every ``anthropic.*`` and ``openai.*`` model, fake or not,
        reaches the fake API and never a real one. A model string the scripts don't know gets
        a 400 (the API-wide script is empty)."""
        update: dict[str, object] = {
            "anthropic": _pointed(
                settings.anthropic or AnthropicSettings(), self.api.base_url_anthropic
            ),
            "openai": _pointed(settings.openai or ProviderSettings(), self.api.base_url_openai),
        }
        if settings.default_model is None:
            # Agents that name no model keep the one they had: with a key configured, the
            # default would otherwise become a provider's (fast-agent's precedence).
            update["default_model"] = ModelCatalog(settings).default_model()
        return settings.model_copy(update=update)

    def start(self) -> FakeModel:
        if self._owns_api:
            self.api.start()
        return self

    def stop(self) -> None:
        if self._owns_api:
            self.api.stop()


P = TypeVar("P", bound=ProviderSettings)


def _pointed(block: P, base_url: str) -> P:
    return block.model_copy(update={"api_key": SecretStr(FAKE_API_KEY), "base_url": base_url})
