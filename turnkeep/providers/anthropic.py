"""Anthropic's Messages API through the official ``anthropic`` SDK (one call; streamed when the
worker serves live text, ``turnkeep.providers.streaming``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from turnkeep.config.settings import ProviderSettings, Settings
from turnkeep.contract.activity_io import ToolSpec
from turnkeep.contract.messages import (
    ContentBlock,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ToolCall,
)
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.turn_io import Usage
from turnkeep.fastagent.model_strings import (
    ANTHROPIC_ADAPTIVE_THINKING,
    ANTHROPIC_NO_THINKING,
    KNOWN_MODELS,
    ModelRef,
    Reasoning,
    anthropic_thinking_budget,
)
from turnkeep.fastagent.model_strings import aliases as model_aliases
from turnkeep.providers.base import ModelProvider, with_usage
from turnkeep.providers.convert import bounded_call_id, plain_blocks, result_blocks, tool_call
from turnkeep.providers.errors import guarded, missing_api_key, request_timeout, response_invalid
from turnkeep.providers.stream_end import (
    is_json,
    json_body,
    no_events,
    send_whole,
    stream_incomplete,
)
from turnkeep.providers.streaming import DeltaSink, delta_sink

PROVIDER = "anthropic"
# The Messages API requires max_tokens: fast-agent's default.
DEFAULT_MAX_TOKENS = 4096
# fast-agent's: room for the answer beyond a thinking budget max_tokens does not exceed.
THINKING_ANSWER_TOKENS = 8192
INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"
# The thinking blocks of an answer as the API sent them (signature included), one JSON text
# each: the API wants them back, unchanged, ahead of the tool calls they led to. fast-agent's
# channel name.
THINKING_BLOCKS = "anthropic-thinking-raw"

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
    aliases: ClassVar[Mapping[str, str]] = model_aliases("anthropic")
    context_window: ClassVar[int | None] = 200_000
    context_windows: ClassVar[Mapping[str, int]] = KNOWN_MODELS["anthropic"]
    max_tokens = DEFAULT_MAX_TOKENS
    streams = True
    # Extended thinking: an effort level, on/off, or a budget in tokens.
    reasoning: ClassVar[frozenset[str]] = frozenset({"effort", "toggle", "budget"})

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
        self.streams = settings.streaming
        self._timeout = timeout
        # fast-agent's anthropic.thinking_enabled / thinking_budget_tokens (a plain
        # ProviderSettings has neither: thinking off).
        self._thinking = bool(getattr(settings, "thinking_enabled", False))
        self._thinking_budget = int(getattr(settings, "thinking_budget_tokens", 10_000))
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
        return await self.complete_model(request, ModelRef(PROVIDER, model_name))

    async def complete_model(self, request: LlmRequest, model: ModelRef) -> Message:
        timeout = self._timeout or request_timeout()
        params = request_params(request, model.name)
        params.update(
            thinking_params(
                model,
                params["max_tokens"],
                enabled=self._thinking,
                budget=self._thinking_budget,
                tools=bool(request.tools),
            )
        )
        sink = delta_sink() if self.streams else None
        if sink is not None:
            streamed = self._streamed(params, timeout, sink)
            return await guarded(streamed, provider=PROVIDER, secret=self._key, timeout_s=timeout)
        call = self._client.messages.create(**params, timeout=timeout)
        response = await guarded(call, provider=PROVIDER, secret=self._key, timeout_s=timeout)
        return from_response(response)

    async def _streamed(self, params: dict[str, Any], limit_s: float, sink: DeltaSink) -> Message:
        """The same call, streamed: each text delta and tool call goes to ``sink`` as it comes;
        the answer is the SDK's assembled message, the one ``create`` would have returned. A
        server that answers with the whole message instead, or ends the stream before its
        ``stop_reason``, is dealt with as ``turnkeep.providers.stream_end`` says."""
        from anthropic.types import Message as AnthropicMessage

        async with self._client.messages.stream(**params, timeout=limit_s) as stream:
            if is_json(stream.response):
                body = await json_body(stream.response, PROVIDER)
                # As the SDK reads a non-streamed answer: built, not validated.
                answer = from_response(AnthropicMessage.construct(**body))
                send_whole(sink, answer)
                return answer
            async for event in stream:
                if event.type == "text":
                    sink.text(event.text)
                elif event.type == "content_block_start" and event.content_block.type == "tool_use":
                    sink.tool_call(event.content_block.name, event.content_block.id)
            try:
                snapshot = stream.current_message_snapshot
            except AssertionError:  # the SDK's way of saying no message_start came
                snapshot = None
            base_url = self._client.base_url
            if snapshot is None:
                raise stream_incomplete(PROVIDER, base_url, no_events(stream.response))
            if snapshot.stop_reason is None:
                raise stream_incomplete(PROVIDER, base_url, "ended without a stop_reason")
            return from_response(snapshot)

    async def aclose(self) -> None:
        await self._client.close()


def request_params(request: LlmRequest, model_name: str) -> dict[str, Any]:
    # No temperature: the SDK has no sampling parameters, and the API version it speaks rejects
    # temperature/top_p/top_k with a 400, so a turn's temperature is moot.
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


def thinking_params(
    model: ModelRef, max_tokens: int, *, enabled: bool, budget: int, tools: bool
) -> dict[str, Any]:
    """The call's extended thinking, as fast-agent asks for it: the model string's reasoning
    setting, else the config's ``thinking_enabled`` with ``thinking_budget_tokens``. Adaptive
    models (Claude 4.6 and later) take an effort level; the others a budget (an effort level
    maps to fast-agent's budget presets), with max_tokens raised past it when it is not
    larger already. Claude models without thinking get none."""
    reasoning = model.reasoning
    if model.name in ANTHROPIC_NO_THINKING or (reasoning is None and not enabled):
        return {}
    reasoning = reasoning or Reasoning(kind="toggle", value=True)
    off = reasoning.value is False or reasoning.value == "none"
    if model.name in ANTHROPIC_ADAPTIVE_THINKING and reasoning.kind != "budget":
        if off:
            return {"thinking": {"type": "disabled"}}
        params: dict[str, Any] = {"thinking": {"type": "adaptive"}}
        if reasoning.kind == "effort" and reasoning.value != "auto":
            effort = "low" if reasoning.value == "minimal" else reasoning.value
            params["output_config"] = {"effort": effort}
        return params
    tokens = anthropic_thinking_budget(reasoning, budget)
    if tokens is None:
        return {}
    params = {
        "thinking": {"type": "enabled", "budget_tokens": tokens},
        "max_tokens": max_tokens if max_tokens > tokens else tokens + THINKING_ANSWER_TOKENS,
    }
    if tools:
        # Thinking between tool calls, not only before the first.
        params["extra_headers"] = {"anthropic-beta": INTERLEAVED_THINKING_BETA}
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
    if message.role == "assistant":
        blocks += thinking_blocks(message)
    blocks += content_blocks(message.content)
    for call_id, call in (message.tool_calls or {}).items():
        # The API only takes an object; arguments the model garbled are sent as none at all.
        arguments = call.arguments if call.invalid_arguments is None else {}
        blocks.append({"type": "tool_use", "id": call_id, "name": call.name, "input": arguments})
    return {"role": message.role, "content": blocks}


def thinking_blocks(message: Message) -> list[dict[str, Any]]:
    """An assistant message's thinking blocks as the API sent them, to send back."""
    out: list[dict[str, Any]] = []
    for block in (message.channels or {}).get(THINKING_BLOCKS, []):
        if isinstance(block, TextContent):
            try:
                raw = json.loads(block.text)
            except ValueError:
                continue
            if isinstance(raw, dict) and raw.get("type") in ("thinking", "redacted_thinking"):
                out.append(raw)
    return out


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
    from anthropic.types import RedactedThinkingBlock, TextBlock, ThinkingBlock, ToolUseBlock

    if not isinstance(response, AnthropicMessage):
        raise response_invalid(PROVIDER, f"expected a message, got {str(response)[:200]!r}")
    try:
        content: list[ContentBlock] = []
        reasoning: list[ContentBlock] = []
        raw_thinking: list[ContentBlock] = []
        calls: dict[str, ToolCall] = {}
        for block in response.content:  # block kinds not handled here (server tools) are skipped
            if isinstance(block, TextBlock):
                content.append(TextContent(text=block.text))
            elif isinstance(block, ThinkingBlock):
                reasoning.append(TextContent(text=block.thinking))
                raw = {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
                raw_thinking.append(TextContent(text=json.dumps(raw)))
            elif isinstance(block, RedactedThinkingBlock):
                raw = {"type": "redacted_thinking", "data": block.data}
                raw_thinking.append(TextContent(text=json.dumps(raw)))
            elif isinstance(block, ToolUseBlock):
                calls[bounded_call_id(block.id)] = tool_call(block.name, block.input)
        usage = response.usage
        channels = {"reasoning": reasoning} if reasoning else {}
        if raw_thinking:
            channels[THINKING_BLOCKS] = raw_thinking
        message = Message(
            role="assistant",
            content=content,
            tool_calls=calls or None,
            channels=channels or None,
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
