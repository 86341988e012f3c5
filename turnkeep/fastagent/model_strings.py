"""fast-agent's model strings: ``provider.model``, aliases, known model names, and reasoning.

A model string is ``[provider.]model[?reasoning=<value>]``, as fast-agent parses it
(``fast_agent.llm.model_factory`` at ``FAST_AGENT_COMMIT``, like the tables below): the
provider prefix (or fast-agent's ``provider/model`` spelling), an alias (``sonnet``,
``gpt-5.5``, ``deepseek``...), or a model name fast-agent's model database gives a provider
(``gpt-5-mini``, ``claude-sonnet-4-5``, ``gemini-2.5-flash``). The reasoning setting is the
``?reasoning=`` query or, as fast-agent did until 0.4, a last
``.minimal``/``.low``/``.medium``/``.high`` part (``openai.o3.high``).

The reasoning setting is part of a model's identity (``ModelRef``): an agent that lists
``gpt-5-mini?reasoning=low`` lets a turn use exactly that, not ``gpt-5-mini?reasoning=high``
nor plain ``gpt-5-mini``, so a client cannot raise the effort (and the bill) past what the
operator configured. Spellings of one model compare equal (``gpt-5-mini.low`` and
``openai.gpt-5-mini?reasoning=low``).

This module knows only text and tables; ``turnkeep.providers.registry`` resolves the provider
part against the registered providers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict

from turnkeep.errors import config_error

# The `.low` suffix is from fast-agent before 0.4.49, which has since dropped it.
EFFORTS = ("auto", "none", "minimal", "low", "medium", "high", "xhigh", "max")
# The older suffix form took only these (fast-agent's EFFORT_MAP).
SUFFIX_EFFORTS = ("minimal", "low", "medium", "high")
TRUE_WORDS = frozenset({"true", "on", "yes", "enable", "enabled", "1"})
FALSE_WORDS = frozenset({"false", "off", "no", "disable", "disabled", "0"})
QUERY_KEYS = ("reasoning",)
# fast-agent provider prefixes that name a turnkeep provider by another name: its Responses
# API models run on turnkeep's OpenAI provider (Chat Completions), and Google through its
# OpenAI-compatible endpoint is turnkeep's only Google.
PREFIX_ALIASES: Mapping[str, str] = {"responses": "openai", "googleoai": "google"}


class Reasoning(BaseModel):
    """A model string's reasoning setting, as fast-agent's ``ReasoningEffortSetting``: an effort
    level, on/off, or a token budget."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["effort", "toggle", "budget"]
    value: str | bool | int

    def __str__(self) -> str:
        if self.kind == "toggle":
            return "on" if self.value else "off"
        return str(self.value)


@dataclass(frozen=True)
class ModelRef:
    """What a model string means: a registered provider, its own model id, and the reasoning
    setting. Two strings naming the same ``ModelRef`` are the same model."""

    provider: str  # a registered provider's name
    name: str  # the provider's model id ("" for a bare provider)
    reasoning: Reasoning | None = None

    def __str__(self) -> str:
        text = f"{self.provider}.{self.name}" if self.name else self.provider
        return f"{text}?reasoning={self.reasoning}" if self.reasoning else text


def parse_reasoning(value: str, model: str) -> Reasoning:
    """fast-agent's reading of a ``reasoning`` value: an effort level (``adaptive`` is
    ``auto``), on/off words, or a budget in tokens."""
    cleaned = value.strip().casefold()
    if cleaned == "adaptive":
        cleaned = "auto"
    if cleaned in EFFORTS:
        return Reasoning(kind="effort", value=cleaned)
    if cleaned in TRUE_WORDS or cleaned in FALSE_WORDS:
        return Reasoning(kind="toggle", value=cleaned in TRUE_WORDS)
    if cleaned.isdigit():
        return Reasoning(kind="budget", value=int(cleaned))
    raise config_error(
        "InvalidModel",
        f"Invalid reasoning value {value!r} in model {model!r}: use one of "
        f"{', '.join(EFFORTS)}, on/off, or a budget in tokens.",
    )


def split_model_string(model: str) -> tuple[str, Reasoning | None, Reasoning | None]:
    """``model`` as (the model part, the ``?reasoning=`` setting, the ``.low`` suffix's). The
    suffix is only a candidate: the caller strips it only if the full name is not a model."""
    spec, question, query = model.strip().partition("?")
    queried: Reasoning | None = None
    if question:
        pairs = parse_qsl(query, keep_blank_values=True)
        unsupported = sorted({key for key, _ in pairs} - set(QUERY_KEYS))
        if unsupported:
            raise config_error(
                "InvalidModel",
                f"Model {model!r}: turnkeep takes only `?reasoning=` in a model string, not "
                f"{', '.join(unsupported)} (set temperature and max_tokens on the agent).",
            )
        values = [value for key, value in pairs if key == "reasoning"]
        if values:
            queried = parse_reasoning(values[-1], model)
    head, dot, last = spec.rpartition(".")
    suffix = (
        Reasoning(kind="effort", value=last.casefold())
        if dot and head and last.casefold() in SUFFIX_EFFORTS
        else None
    )
    return spec, queried, suffix


def anthropic_thinking_budget(reasoning: Reasoning, configured: int) -> int | None:
    """Thinking tokens for a budget-based Claude model, as fast-agent maps effort to its
    budget presets (1,024 / 16,000 / 32,000): minimal and low the smallest, medium the middle,
    anything higher the largest. None: no thinking (off, none). ``auto`` and ``on`` take the
    configured budget (``anthropic.thinking_budget_tokens``). The API's minimum is 1,024."""
    match reasoning.kind, reasoning.value:
        case "toggle", False:
            return None
        case "toggle", True:
            return max(1024, configured)
        case "budget", int(budget):
            return None if budget == 0 else max(1024, budget)
        case "effort", "none":
            return None
        case "effort", "auto":
            return max(1024, configured)
        case "effort", str(effort):
            return ANTHROPIC_EFFORT_BUDGETS.get(effort, ANTHROPIC_EFFORT_BUDGETS["high"])
    return max(1024, configured)


ANTHROPIC_EFFORT_BUDGETS: Mapping[str, int] = {
    "minimal": 1024,
    "low": 1024,
    "medium": 16_000,
    "high": 32_000,
}


def aliases(provider: str) -> dict[str, str]:
    """fast-agent's aliases and known model names for ``provider``: alias -> model id, possibly
    with a ``?reasoning=`` default."""
    table = {model: model for model in KNOWN_MODELS.get(provider, {})}
    table.update(ALIASES.get(provider, {}))
    return table


# --- fast-agent's tables (fast_agent.llm.model_aliases and model_database) --------------------
#
# Only the entries for providers turnkeep has; `responses.` models are on `openai`.

ALIASES: Mapping[str, Mapping[str, str]] = {
    "anthropic": {
        "sonnet": "claude-sonnet-5",
        "sonnet5": "claude-sonnet-5",
        "sonnet4": "claude-sonnet-4-6",
        "sonnet46": "claude-sonnet-4-6",
        "claude": "claude-sonnet-5",
        "haiku": "claude-haiku-4-5",
        "haiku45": "claude-haiku-4-5",
        "opus": "claude-opus-5",
        "opus4": "claude-opus-4-8",
        "opus5": "claude-opus-5",
        "opus46": "claude-opus-4-6",
        "opus47": "claude-opus-4-7",
        "opus48": "claude-opus-4-8",
        "fable": "claude-fable-5",
        "fable5": "claude-fable-5",
    },
    "openai": {
        "gpt51": "gpt-5.1",
        "gpt52": "gpt-5.2",
        "gpt54": "gpt-5.4",
        "gpt55": "gpt-5.5",
        "gpt56": "gpt-5.6",
        "gpt56-sol": "gpt-5.6-sol",
        "gpt56-terra": "gpt-5.6-terra",
        "gpt56-luna": "gpt-5.6-luna",
        "gpt54-mini": "gpt-5.4-mini",
        "gpt54-nano": "gpt-5.4-nano",
        "chatgpt": "chat-latest",
        "codex": "gpt-5.3-codex",
        "gpt-5.6-sol": "gpt-5.6-sol?reasoning=medium",
        "gpt-5.6-terra": "gpt-5.6-terra?reasoning=medium",
        "gpt-5.6-luna": "gpt-5.6-luna?reasoning=medium",
        "gpt-5.5": "gpt-5.5?reasoning=medium",
        "gpt-5.4": "gpt-5.4?reasoning=medium",
        "gpt-5.4-mini": "gpt-5.4-mini?reasoning=medium",
        "gpt-5.4-nano": "gpt-5.4-nano?reasoning=medium",
        "gpt-5.3-codex": "gpt-5.3-codex?reasoning=high",
        "gpt-5.2": "gpt-5.2?reasoning=medium",
    },
    "deepseek": {
        "deepseek": "deepseek-v4-flash",
        "deepseekpro": "deepseek-v4-pro",
        "deepseekv3": "deepseek-chat",  # fast-agent before 0.5
    },
    "google": {
        "gemini": "gemini-3.1-pro-preview",
        "gemini2": "gemini-2.0-flash",
        "gemini25": "gemini-2.5-flash",
        "gemini25pro": "gemini-2.5-pro",
        "gemini35": "gemini-3.5-flash",
        "gemini35flash": "gemini-3.5-flash",
        "gemini3.5flash": "gemini-3.5-flash",
        "gemini3": "gemini-3-pro-preview",
        "gemini3.1": "gemini-3.1-pro-preview",
        "gemini31pro": "gemini-3.1-pro-preview",
        "gemini3.1flashlite": "gemini-3.1-flash-lite-preview",
        "gemini3flash": "gemini-3-flash-preview",
    },
    "xai": {
        "grok": "grok-4.6",
        "grok4": "grok-4.6",
        "grok43": "grok-4.3",
        "grok45": "grok-4.5",
        "grok46": "grok-4.6",
    },
    "groq": {
        "qwen3.6-27b": "qwen/qwen3.6-27b",
        "qwen3-32b": "qwen/qwen3-32b",
    },
}

# Claude's generation with adaptive thinking, all of whose models have a 1M-token window.
ANTHROPIC_ADAPTIVE_MODELS = (
    "claude-sonnet-4-6",
    "claude-sonnet-5",
    "claude-opus-4-6",
    "claude-opus-4-7",
    "claude-opus-4-8",
    "claude-opus-5",
    "claude-fable-5",
)

# Model name -> context window (tokens): the names fast-agent gives a provider without a
# prefix, and the windows turnkeep compacts against. A model not here (and every
# `openrouter.`, `azure.` and `generic.` one) has no known window until the config gives one.
KNOWN_MODELS: Mapping[str, Mapping[str, int]] = {
    "openai": {
        **dict.fromkeys(
            (
                "gpt-4.1",
                "gpt-4.1-mini",
                "gpt-4.1-nano",
                "gpt-4.1-2025-04-14",
                "gpt-4.1-mini-2025-04-14",
                "gpt-4.1-nano-2025-04-14",
            ),
            1_047_576,
        ),
        **dict.fromkeys(
            ("gpt-4o", "gpt-4o-mini", "gpt-4o-2024-11-20", "gpt-4o-mini-2024-07-18"), 128_000
        ),
        **dict.fromkeys(
            (
                "o1",
                "o1-mini",
                "o1-preview",
                "o1-2024-12-17",
                "o3",
                "o3-mini",
                "o4-mini",
                "o3-2025-04-16",
                "o3-mini-2025-01-31",
                "o4-mini-2025-04-16",
            ),
            200_000,
        ),
        **dict.fromkeys(
            (
                "gpt-5",
                "gpt-5-mini",
                "gpt-5-nano",
                "gpt-5-nano-2025-08-07",
                "gpt-5.1",
                "gpt-5.2",
                "gpt-5.3-codex",
                "gpt-5.4",
                "gpt-5.5",
            ),
            272_000,
        ),
        **dict.fromkeys(("gpt-5.6", "gpt-5.6-sol", "gpt-5.6-terra"), 1_050_000),
        **dict.fromkeys(("gpt-5.6-luna", "gpt-5.4-mini", "gpt-5.4-nano"), 400_000),
        **dict.fromkeys(("gpt-5.3-chat-latest", "chat-latest"), 128_000),
    },
    "anthropic": {
        **dict.fromkeys(
            (
                "claude-3-5-haiku",
                "claude-3-5-haiku-20241022",
                "claude-3-5-haiku-latest",
                "claude-sonnet-4-0",
                "claude-sonnet-4-20250514",
                "claude-sonnet-4-5",
                "claude-sonnet-4-5-20250929",
                "claude-opus-4-0",
                "claude-opus-4-1",
                "claude-opus-4-5",
                "claude-opus-4-20250514",
                "claude-haiku-4-5-20251001",
                "claude-haiku-4-5",
            ),
            200_000,
        ),
        **dict.fromkeys(ANTHROPIC_ADAPTIVE_MODELS, 1_000_000),
    },
    "deepseek": {
        "deepseek-v4-flash": 1_048_576,
        "deepseek-v4-pro": 1_048_576,
        "deepseek-chat": 65_536,  # fast-agent before 0.5
    },
    "google": dict.fromkeys(
        (
            "gemini-2.0-flash",
            "gemini-2.5-pro",
            "gemini-2.5-flash",
            "gemini-3.5-flash",
            "gemini-3-pro-preview",
            "gemini-3-flash-preview",
            "gemini-3.1-pro-preview",
            "gemini-3.1-flash-lite-preview",
        ),
        1_048_576,
    ),
    "xai": {"grok-4.3": 1_000_000, "grok-4.5": 500_000, "grok-4.6": 500_000},
    "groq": dict.fromkeys(
        ("qwen/qwen3-32b", "qwen/qwen3.6-27b", "openai/gpt-oss-120b", "openai/gpt-oss-20b"),
        131_072,
    ),
}

# Claude models without extended thinking, and those whose thinking is adaptive (an effort
# level in `output_config`, not a token budget); every other Claude model takes a budget.
ANTHROPIC_NO_THINKING = frozenset(
    {"claude-3-5-haiku", "claude-3-5-haiku-20241022", "claude-3-5-haiku-latest"}
)
ANTHROPIC_ADAPTIVE_THINKING = frozenset(ANTHROPIC_ADAPTIVE_MODELS)
