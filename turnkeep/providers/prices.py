"""What model calls cost: a price per provider and model in US dollars per million tokens, built
in for the models turnkeep knows and overridable in the config (``prices:``), and the cost of a
call's ``Usage`` by it.

fast-agent reports a cost only when the provider's API does (OpenRouter); turnkeep prices each
call itself, so a cost is there whatever the provider. A model with no price has an unknown
cost (``None``), never zero: ``turnkeep show``, ``TurnResult.usage`` and the metrics say
"unknown" until the config gives it one. The built-in figures are the providers' list prices
for standard (not batch, not long-context) requests; a contract with other prices sets them in
``prices:``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from turnkeep.contract.messages import Message, json_channel
from turnkeep.contract.turn_io import Usage

PER_MILLION = 1_000_000


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens of each kind. Token counts are in Anthropic's sense (input tokens
    exclude those read from or written to the cache: ``turnkeep.providers.openai.usage_of``)."""

    input: float
    output: float
    cache_read: float | None = None  # None: as input
    cache_write: float | None = None  # None: as input

    def cost(self, usage: Usage) -> float:
        read = self.input if self.cache_read is None else self.cache_read
        write = self.input if self.cache_write is None else self.cache_write
        dollars = (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_read_tokens * read
            + usage.cache_write_tokens * write
        )
        return dollars / PER_MILLION

    @property
    def input_per_token(self) -> float:
        return self.input / PER_MILLION


FREE = ModelPrice(input=0.0, output=0.0, cache_read=0.0, cache_write=0.0)


def _each(names: tuple[str, ...], price: ModelPrice) -> dict[str, ModelPrice]:
    return dict.fromkeys(names, price)


# Provider -> the provider's model id -> price. Only models whose price is published and
# settled; any other costs "unknown" until `prices:` names it.
BUILTIN_PRICES: Mapping[str, Mapping[str, ModelPrice]] = {
    # The offline models cost nothing.
    "passthrough": {"": FREE},
    "playback": {"": FREE},
    "anthropic": {
        **_each(
            ("claude-opus-4-0", "claude-opus-4-1", "claude-opus-4-20250514"),
            ModelPrice(15.0, 75.0, 1.5, 18.75),
        ),
        "claude-opus-4-5": ModelPrice(5.0, 25.0, 0.5, 6.25),
        **_each(
            (
                "claude-sonnet-4-0",
                "claude-sonnet-4-20250514",
                "claude-sonnet-4-5",
                "claude-sonnet-4-5-20250929",
            ),
            ModelPrice(3.0, 15.0, 0.3, 3.75),
        ),
        **_each(("claude-haiku-4-5", "claude-haiku-4-5-20251001"), ModelPrice(1.0, 5.0, 0.1, 1.25)),
        **_each(
            ("claude-3-5-haiku", "claude-3-5-haiku-20241022", "claude-3-5-haiku-latest"),
            ModelPrice(0.8, 4.0, 0.08, 1.0),
        ),
    },
    "openai": {
        **_each(("gpt-4.1", "gpt-4.1-2025-04-14"), ModelPrice(2.0, 8.0, 0.5)),
        **_each(("gpt-4.1-mini", "gpt-4.1-mini-2025-04-14"), ModelPrice(0.4, 1.6, 0.1)),
        **_each(("gpt-4.1-nano", "gpt-4.1-nano-2025-04-14"), ModelPrice(0.1, 0.4, 0.025)),
        **_each(("gpt-4o", "gpt-4o-2024-11-20"), ModelPrice(2.5, 10.0, 1.25)),
        **_each(("gpt-4o-mini", "gpt-4o-mini-2024-07-18"), ModelPrice(0.15, 0.6, 0.075)),
        **_each(("o1", "o1-2024-12-17"), ModelPrice(15.0, 60.0, 7.5)),
        **_each(("o3", "o3-2025-04-16"), ModelPrice(2.0, 8.0, 0.5)),
        **_each(("o3-mini", "o3-mini-2025-01-31"), ModelPrice(1.1, 4.4, 0.55)),
        **_each(("o4-mini", "o4-mini-2025-04-16"), ModelPrice(1.1, 4.4, 0.275)),
        **_each(("gpt-5", "gpt-5.1"), ModelPrice(1.25, 10.0, 0.125)),
        "gpt-5-mini": ModelPrice(0.25, 2.0, 0.025),
        **_each(("gpt-5-nano", "gpt-5-nano-2025-08-07"), ModelPrice(0.05, 0.4, 0.005)),
    },
    "google": {
        "gemini-2.0-flash": ModelPrice(0.1, 0.4, 0.025),
        "gemini-2.5-flash": ModelPrice(0.3, 2.5, 0.075),
        "gemini-2.5-pro": ModelPrice(1.25, 10.0, 0.31),
    },
}


def builtin_price(provider: str, model: str) -> ModelPrice | None:
    """turnkeep's own price of ``model`` (the provider's id) on ``provider``, if it has one."""
    return BUILTIN_PRICES.get(provider, {}).get(model)


def cost_of(usage: Usage, price: ModelPrice | None) -> float | None:
    """What ``usage`` cost at ``price``; None when the price is unknown."""
    return None if price is None else price.cost(usage)


def with_cost(answer: Message, price: ModelPrice | None) -> Message:
    """``answer`` with its ``usage`` channel's ``cost_usd`` (left out when the price is
    unknown, which reads back as unknown)."""
    reported = answer.channel_json("usage")
    if price is None or not isinstance(reported, dict):
        return answer
    usage = Usage.model_validate(reported)
    channels = dict(answer.channels or {})
    priced = {**reported, "cost_usd": round(price.cost(usage), 9)}
    channels["usage"] = json_channel(priced)
    return answer.model_copy(update={"channels": channels})
