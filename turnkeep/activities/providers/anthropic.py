"""Anthropic's Messages API through the official ``anthropic`` SDK (one non-streaming call)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from turnkeep.activities.providers import ModelProvider, with_usage
from turnkeep.activities.providers.convert import (
    bounded_call_id,
    plain_blocks,
    result_blocks,
    tool_call,
)
from turnkeep.activities.providers.errors import (
    guarded,
    missing_api_key,
    request_timeout,
    response_invalid,
)
from turnkeep.settings import ProviderSettings, Settings
from turnkeep.workflows.activity_io import LlmRequest, ToolSpec
from turnkeep.workflows.messages import (
    ContentBlock,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ToolCall,
)
from turnkeep.workflows.turn_io import Usage

PROVIDER = "anthropic"
# The Messages API requires max_tokens: fast-agent's default.
DEFAULT_MAX_TOKENS = 4096

STOP_REASONS = {
    "end_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.MAX_TOKENS,
    "model_context_window_exceeded": StopReason.MAX_TOKENS,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "pause_turn": StopReason.PAUSE,
    "refusal": StopReason.SAFETY,
}

STRUCTURED_OUTPUT_INSTRUCTION = (
    "Answer with a single JSON value that matches this JSON Schema, and nothing else "
    "(no prose, no code fences):\n{schema}"
)


class AnthropicProvider(ModelProvider):
    name = PROVIDER
    aliases: ClassVar[Mapping[str, str]] = {
        "sonnet": "claude-sonnet-4-5",
        "haiku": "claude-haiku-4-5",
        "opus": "claude-opus-4-1",
    }
    context_window = 200_000
    max_tokens = DEFAULT_MAX_TOKENS

    def __init__(self, settings: ProviderSettings | None, *, timeout: float | None = None) -> None:
        """``timeout`` fixes the per-request timeout (tests); by default it follows the
        activity's start-to-close timeout."""
        # Here, not at the top: registering the provider must not load the SDK (seconds).
        from anthropic import AsyncAnthropic

        settings = settings or ProviderSettings()
        key = (
            settings.api_key.get_secret_value()
            if settings.api_key
            else os.environ.get("ANTHROPIC_API_KEY")
        )
        if not key:
            raise missing_api_key("Anthropic", "anthropic.api_key", "ANTHROPIC_API_KEY")
        self._key = key
        self._timeout = timeout
        self._client = AsyncAnthropic(
            api_key=key,
            base_url=settings.base_url or os.environ.get("ANTHROPIC_BASE_URL") or None,
            max_retries=0,  # Temporal's retry policy does the retrying
            default_headers=settings.default_headers,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> AnthropicProvider:
        return cls(settings.anthropic)

    @classmethod
    def default_model(cls, settings: Settings) -> str | None:
        has_key = os.environ.get("ANTHROPIC_API_KEY") or (
            settings.anthropic and settings.anthropic.api_key
        )
        return "sonnet" if has_key else None

    async def complete(self, request: LlmRequest, model_name: str) -> Message:
        timeout = self._timeout or request_timeout()
        response = await guarded(
            self._client.messages.create(**request_params(request, model_name), timeout=timeout),
            provider=PROVIDER,
            secret=self._key,
            timeout_s=timeout,
        )
        return from_response(response)

    async def aclose(self) -> None:
        await self._client.close()


def request_params(request: LlmRequest, model_name: str) -> dict[str, Any]:
    # No temperature: SDK 2.x has no sampling parameters and the API version it speaks
    # (2026-10-21) rejects temperature/top_p/top_k with a 400, so a turn's temperature is moot.
    params: dict[str, Any] = {
        "model": model_name,
        "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
        # The API rejects a message with no content (an error-only assistant message, say); it
        # merges the consecutive same-role messages that leaving one out can produce.
        "messages": [m for m in map(to_anthropic, request.messages) if m["content"]],
    }
    system = [request.instruction] if request.instruction else []
    if request.structured_output is not None:
        schema = json.dumps(request.structured_output, indent=2)
        system.append(STRUCTURED_OUTPUT_INSTRUCTION.format(schema=schema))
    if system:
        params["system"] = "\n\n".join(system)
    if request.tools:
        params["tools"] = [tool_param(tool) for tool in request.tools]
    return params


def tool_param(tool: ToolSpec) -> dict[str, Any]:
    param: dict[str, Any] = {"name": tool.name, "input_schema": tool.input_schema}
    if tool.description:
        param["description"] = tool.description
    return param


def to_anthropic(message: Message) -> dict[str, Any]:
    """One turnkeep message as a Messages API message. Tool results lead a user message (the API
    requires them first); an assistant's tool calls follow its text."""
    blocks: list[dict[str, Any]] = []
    for call_id, result in (message.tool_results or {}).items():
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
        content = content_blocks(result_blocks(result))
        if content:
            block["content"] = content
        if result.is_error:
            block["is_error"] = True
        blocks.append(block)
    blocks += content_blocks(message.content)
    for call_id, call in (message.tool_calls or {}).items():
        # The API only takes an object; arguments the model garbled are sent as none at all.
        arguments = call.arguments if call.invalid_arguments is None else {}
        blocks.append({"type": "tool_use", "id": call_id, "name": call.name, "input": arguments})
    return {"role": message.role, "content": blocks}


def content_blocks(blocks: Sequence[ContentBlock]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in plain_blocks(blocks):
        if isinstance(block, ImageContent):
            source = {"type": "base64", "media_type": block.mime_type, "data": block.data}
            out.append({"type": "image", "source": source})
        else:
            out.append({"type": "text", "text": block.text})
    return out


def from_response(response: object) -> Message:
    """The assistant message for an API response; anything unexpected in its shape is a
    non-retryable ``ProviderResponseInvalid`` (asking again would get the same answer)."""
    from anthropic.types import Message as AnthropicMessage
    from anthropic.types import TextBlock, ThinkingBlock, ToolUseBlock

    if not isinstance(response, AnthropicMessage):
        raise response_invalid(PROVIDER, f"expected a message, got {str(response)[:200]!r}")
    try:
        content: list[ContentBlock] = []
        reasoning: list[ContentBlock] = []
        calls: dict[str, ToolCall] = {}
        for block in response.content:  # block kinds not handled here (server tools) are skipped
            if isinstance(block, TextBlock):
                content.append(TextContent(text=block.text))
            elif isinstance(block, ThinkingBlock):
                reasoning.append(TextContent(text=block.thinking))
            elif isinstance(block, ToolUseBlock):
                calls[bounded_call_id(block.id)] = tool_call(block.name, block.input)
        usage = response.usage
        message = Message(
            role="assistant",
            content=content,
            tool_calls=calls or None,
            channels={"reasoning": reasoning} if reasoning else None,
            stop_reason=STOP_REASONS.get(response.stop_reason or "", StopReason.END_TURN),
        )
        return with_usage(
            message,
            Usage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cache_read_tokens=usage.cache_read_input_tokens or 0,
                cache_write_tokens=usage.cache_creation_input_tokens or 0,
            ),
        )
    except (AttributeError, TypeError, ValueError) as err:  # pydantic's errors are ValueErrors
        raise response_invalid(PROVIDER, f"{type(err).__name__}: {err}") from None
