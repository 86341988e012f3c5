"""What model calls cost: the providers' list prices from ``genai-prices``, overridable in the
config (``prices:``), and the cost of a call's ``Usage`` by them.

fast-agent reports a cost only when the provider's API does (OpenRouter); turnkeep prices each
call itself, so a cost is there whatever the provider. A model with no price has an unknown
cost (``None``), never zero: ``turnkeep show``, ``TurnResult.usage`` and the metrics say
"unknown" until the config gives it one.

The list prices are ``genai-prices``' (kept by the Pydantic team from the providers' pricing
pages, with their changes over time and their tiers), read from the data its package ships:
its ``UpdatePrices`` would fetch newer data over the network, and is never started, so a price
is the same offline and moves only with the installed version. A contract with other prices
sets them in ``prices:``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from turnkeep.contract.messages import Message, json_channel
from turnkeep.contract.turn_io import Usage

if TYPE_CHECKING:
    import genai_prices

PER_MILLION = 1_000_000

# turnkeep's provider -> genai-prices' id for it: the providers whose model ids are the
# provider's own. Not `azure` (a model id there is a deployment, named by its owner) nor
# `generic` (any server): their models cost "unknown" until `prices:` names them.
GENAI_PROVIDERS = {
    "anthropic": "anthropic",
    "openai": "openai",
    "google": "google",
    "deepseek": "deepseek",
    "groq": "groq",
    "xai": "x-ai",
    "openrouter": "openrouter",
}
# The offline models cost nothing.
OFFLINE = frozenset({"passthrough", "playback", "recorded"})


class Price(Protocol):
    """A model's price: what a call's usage cost, and a token of input for a dollar budget's
    estimates."""

    def cost(self, usage: Usage) -> float: ...

    @property
    def input_per_token(self) -> float: ...


@dataclass(frozen=True)
class ModelPrice:
    """A flat price (the config's ``prices:``): USD per million tokens of each kind. Token
    counts are in Anthropic's sense (input tokens exclude those read from or written to the
    cache: ``turnkeep.providers.openai.usage_of``)."""

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


@dataclass(frozen=True)
class ListPrice:
    """A model's list price in ``genai-prices``, at the time of the call (prices change on
    dates, and some by the time of day) and by its size (some are dearer past a number of
    input tokens)."""

    provider_id: str  # genai-prices' id
    model: str  # the provider's model id

    def cost(self, usage: Usage) -> float:
        return float(self._calc(_genai_usage(usage)).total_price)

    @property
    def input_per_token(self) -> float:
        # One token: the price of a call below any tier's threshold.
        return float(self._calc(_genai_usage(Usage(input_tokens=1))).input_price)

    def _calc(self, usage: genai_prices.Usage) -> genai_prices.types.PriceCalculation:
        # Imported on first use: loading the price data takes a while, and a process that
        # never prices a call (the CLI, a turn's setup without a dollar budget) need not.
        from genai_prices import calc_price

        return calc_price(usage, self.model, provider_id=self.provider_id)


def _genai_usage(usage: Usage) -> genai_prices.Usage:
    """``usage`` in genai-prices' sense, whose input tokens include the cache's."""
    from genai_prices import Usage as GenaiUsage

    return GenaiUsage(
        input_tokens=usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )


def builtin_price(provider: str, model: str) -> Price | None:
    """The list price of ``model`` (the provider's id) on ``provider``, if it has one."""
    if provider in OFFLINE:
        return FREE
    provider_id = GENAI_PROVIDERS.get(provider)
    if provider_id is None:
        return None
    price = ListPrice(provider_id, model)
    try:
        price.cost(Usage())
    except LookupError:  # a model genai-prices does not know
        return None
    return price


def with_cost(answer: Message, price: Price | None) -> Message:
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
