"""OpenAI's Chat Completions API through the official ``openai`` SDK (one call; streamed when the
worker serves live text, ``turnkeep.providers.streaming``).

``generic`` is the same API on any OpenAI-compatible server (Ollama, vLLM, llama.cpp, LM Studio),
as fast-agent's ``generic.<model>``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from turnkeep.config.settings import ProviderSettings, Settings
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
from turnkeep.errors import config_error
from turnkeep.fastagent.model_strings import KNOWN_MODELS, ModelRef, Reasoning
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

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.completion_usage import CompletionUsage

log = logging.getLogger(__name__)

# Local servers ignore the key, but the SDK refuses to run without one.
PLACEHOLDER_GENERIC_KEY = "ollama"
# What a server that does not know a request field answers (400 from most, 422 from servers
# that validate the body with a schema).
UNKNOWN_FIELD_STATUS = (400, 422)

FINISH_REASONS = {
    "stop": StopReason.END_TURN,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "length": StopReason.MAX_TOKENS,
    "content_filter": StopReason.SAFETY,
}
# Compatible servers put a reasoning model's thinking in one of these non-standard fields.
REASONING_FIELDS = ("reasoning_content", "reasoning")


class OpenAIProvider(ModelProvider):
    name = "openai"
    # fast-agent's aliases and model names (its `responses.` ones included: same key, same
    # models, here through Chat Completions).
    aliases: ClassVar[Mapping[str, str]] = model_aliases("openai")
    context_window: ClassVar[int | None] = 128_000
    context_windows: ClassVar[Mapping[str, int]] = KNOWN_MODELS["openai"]
    # `?reasoning=<effort>` and on/off, sent as `reasoning_effort`.
    reasoning: ClassVar[frozenset[str]] = frozenset({"effort", "toggle"})
    streams = True
    # Whether a streamed call asks for its usage (`stream_options`): until the server refuses
    # them once (``_streamed``); per instance, so per worker and provider.
    stream_usage = True

    def __init__(
        self, settings: ProviderSettings | None, *, generic: bool, timeout: float | None = None
    ) -> None:
        """``timeout`` fixes the per-request timeout (tests); by default it follows the
        activity's start-to-close timeout."""
        settings = settings or ProviderSettings()
        self._name = "generic" if generic else "openai"
        self._generic = generic
        self._timeout = timeout
        key = settings.api_key.get_secret_value() if settings.api_key else None
        base_url: str | None
        if generic:
            key = key or os.environ.get("GENERIC_API_KEY")
            base_url = generic_base_url(settings)
        else:
            key = key or os.environ.get("OPENAI_API_KEY")
            if not key:
                raise missing_api_key("OpenAI", "openai.api_key", "OPENAI_API_KEY")
            base_url = settings.base_url or os.environ.get("OPENAI_BASE_URL") or None
        self._key = key
        self.streams = settings.streaming
        self._client = sdk_client(settings, key, base_url)

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAIProvider:
        return cls(settings.openai, generic=False)

    @classmethod
    def default_model(cls, settings: Settings) -> str | None:
        has_key = os.environ.get("OPENAI_API_KEY") or (settings.openai and settings.openai.api_key)
        return "openai.gpt-4.1-mini" if has_key else None

    async def complete(self, request: LlmRequest, model_name: str) -> Message:
        return await self.complete_model(request, ModelRef(self._name, model_name))

    async def complete_model(self, request: LlmRequest, model: ModelRef) -> Message:
        timeout = self._timeout or request_timeout()
        params = sdk_arguments(request_params(request, model.name, generic=self._generic))
        if model.reasoning is not None and (effort := self.effort(model.reasoning)):
            params["reasoning_effort"] = effort
        sink = delta_sink() if self.streams else None
        if sink is not None:
            streamed = self._streamed(params, timeout, sink)
            return await guarded(streamed, provider=self._name, secret=self._key, timeout_s=timeout)
        call = self._client.chat.completions.create(**params, timeout=timeout)
        completion = await guarded(call, provider=self._name, secret=self._key, timeout_s=timeout)
        return from_completion(completion, self._name)

    async def _streamed(self, params: dict[str, Any], limit_s: float, sink: DeltaSink) -> Message:
        """The same call, streamed: each text delta and tool call goes to ``sink`` as it comes;
        the answer is the chunks assembled by the SDK's own accumulator into the completion
        ``create`` would have returned (usage included: ``include_usage``, where the server
        takes it). A server that answers with the whole completion instead, or ends the stream
        before its ``finish_reason``, is dealt with as ``turnkeep.providers.stream_end`` says."""
        from openai import APIStatusError
        from openai.lib.streaming.chat import ChatCompletionStreamState
        from openai.types.chat import ChatCompletion

        create = self._client.chat.completions.create
        if not self.stream_usage:
            stream = await create(**params, stream=True, timeout=limit_s)
        else:
            try:
                stream = await create(
                    **params, stream=True, stream_options={"include_usage": True}, timeout=limit_s
                )
            except APIStatusError as err:
                if err.status_code not in UNKNOWN_FIELD_STATUS:
                    raise
                # Some OpenAI-compatible servers refuse `stream_options`. Ask once more without
                # them: if that is taken, they were the cause, and later calls skip them rather
                # than pay a refused request each. Otherwise this answer's error is the one.
                stream = await create(**params, stream=True, timeout=limit_s)
                self.stream_usage = False
                log.warning(
                    "%s refused stream_options (%s): streamed calls go on without asking for "
                    "usage, so they count only the tokens the server reports unasked",
                    self._name,
                    err.status_code,
                )
        state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
        async with stream:
            if is_json(stream.response):
                body = await json_body(stream.response, self._name)
                # As the SDK reads a non-streamed answer: built, not validated.
                answer = from_completion(ChatCompletion.construct(**body), self._name)
                send_whole(sink, answer)
                return answer
            async for chunk in stream:
                state.handle_chunk(chunk)
                for choice in chunk.choices:
                    if choice.index != 0:
                        continue
                    if choice.delta.content:
                        sink.text(choice.delta.content)
                    for call in choice.delta.tool_calls or []:
                        if call.id and call.function and call.function.name:
                            sink.tool_call(call.function.name, call.id)
        try:
            snapshot = state.current_completion_snapshot
        except AssertionError:  # the SDK's way of saying no chunk came
            snapshot = None
        if snapshot is None or not snapshot.choices:
            what = no_events(stream.response)
            raise stream_incomplete(self._name, self._client.base_url, what)
        if snapshot.choices[0].finish_reason is None:
            raise stream_incomplete(
                self._name, self._client.base_url, "ended without a finish_reason"
            )
        return from_completion(state.get_final_completion(), self._name)

    @staticmethod
    def effort(reasoning: Reasoning) -> str | None:
        """``reasoning_effort`` for a model string's setting (None: send none, the model's
        default): the effort level as given, ``none`` for off."""
        if reasoning.kind == "toggle":
            return None if reasoning.value else "none"
        return None if reasoning.value == "auto" else str(reasoning.value)

    async def aclose(self) -> None:
        await self._client.close()


class GenericProvider(OpenAIProvider):
    """``generic.<model>``: the same API on the OpenAI-compatible server the config names."""

    name = "generic"
    aliases: ClassVar[Mapping[str, str]] = {}
    # Whatever the server runs: unknown until the config's `generic.context_window` says.
    context_window: ClassVar[int | None] = None
    context_windows: ClassVar[Mapping[str, int]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAIProvider:
        return cls(settings.generic, generic=True)

    @classmethod
    def check(cls, settings: Settings) -> None:
        generic_base_url(settings.generic)

    @classmethod
    def default_model(cls, settings: Settings) -> str | None:
        del settings
        return None


def sdk_client(settings: ProviderSettings, key: str | None, base_url: str | None) -> AsyncOpenAI:
    """The ``openai`` SDK's client for a provider, with its retries off: Temporal's retry
    policy does the retrying."""
    # Here, not at the top: registering a provider must not load the SDK.
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        api_key=key or PLACEHOLDER_GENERIC_KEY,
        base_url=base_url,
        max_retries=0,
        default_headers=settings.default_headers,
    )


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


def request_params(request: LlmRequest, model_name: str, *, generic: bool) -> dict[str, Any]:
    params: dict[str, Any] = {"model": model_name, "messages": to_openai(request)}
    if request.tools:
        params["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description or "",
                    "parameters": tool.input_schema,
                },
            }
            for tool in request.tools
        ]
    if request.temperature is not None:
        params["temperature"] = request.temperature
    if request.max_tokens:
        # OpenAI deprecated max_tokens (its reasoning models reject it); compatible servers
        # widely understand only max_tokens.
        params["max_tokens" if generic else "max_completion_tokens"] = request.max_tokens
    if request.structured_output is not None:
        params["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": "final_answer",
                "schema": request.structured_output,
                "strict": False,
            },
        }
    return params


def sdk_arguments(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as the SDK's ``create`` takes them, the conversation in ``extra_body``.

    ``create`` walks its arguments against their typed-dict annotations (``async_maybe_transform``,
    for the few fields it renames or re-encodes) before it serialises them; for the messages
    that is a copy of every one, with a round of type inspection per key, on every call. A
    conversation of hundreds of messages made that the largest cost of a long turn's model call,
    growing with each iteration. No message field is renamed or re-encoded (the chat message
    types declare no ``PropertyInfo``), so the messages go as built: ``extra_body`` is merged
    into the request's JSON after the walk, replacing the empty list given to ``create``."""
    messages = params.pop("messages")
    extra = {**params.get("extra_body", {}), "messages": messages}
    return {**params, "messages": [], "extra_body": extra}


def to_openai(request: LlmRequest) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": request.instruction}] if request.instruction else []
    for message in request.messages:
        messages += (
            assistant_entry(message) if message.role == "assistant" else user_entries(message)
        )
    return messages


def assistant_entry(message: Message) -> list[dict[str, Any]]:
    text = "\n".join(b.text for b in plain_blocks(message.content) if isinstance(b, TextContent))
    if not text and not message.tool_calls:
        return []
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    if message.tool_calls:
        entry["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": arguments_text(call)},
            }
            for call_id, call in message.tool_calls.items()
        ]
    return [entry]


def arguments_text(call: ToolCall) -> str:
    # What the model sent, even when it was not valid JSON: that is what it has to correct.
    if call.invalid_arguments is not None:
        return call.invalid_arguments
    return json.dumps(call.arguments)


def user_entries(message: Message) -> list[dict[str, Any]]:
    """One ``tool`` message per result, then the user's own content. Tool messages carry only
    text, so images a tool returned ride along in that user message, labelled with the call."""
    entries: list[dict[str, Any]] = []
    parts: list[TextContent | ImageContent] = []
    for call_id, result in (message.tool_results or {}).items():
        blocks = result_blocks(result)
        text = "\n".join(b.text for b in blocks if isinstance(b, TextContent))
        entries.append({"role": "tool", "tool_call_id": call_id, "content": text})
        images = [b for b in blocks if isinstance(b, ImageContent)]
        if images:
            parts += [TextContent(text=f"Image(s) returned by tool call {call_id}:"), *images]
    parts += plain_blocks(message.content)
    if parts:
        entries.append({"role": "user", "content": user_content(parts)})
    return entries


def user_content(blocks: list[TextContent | ImageContent]) -> str | list[dict[str, Any]]:
    if all(isinstance(b, TextContent) for b in blocks):
        # A plain string is what every compatible server accepts.
        return "\n".join(b.text for b in blocks if isinstance(b, TextContent))
    return [content_part(b) for b in blocks]


def content_part(block: TextContent | ImageContent) -> dict[str, Any]:
    if isinstance(block, ImageContent):
        url = f"data:{block.mime_type};base64,{block.data}"
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "text", "text": block.text}


def from_completion(completion: object, provider: str) -> Message:
    """The assistant message for a completion; anything unexpected in its shape is a
    non-retryable ``ProviderResponseInvalid`` (asking again would get the same answer)."""
    from openai.types.chat import ChatCompletion, ChatCompletionMessageFunctionToolCall

    if not isinstance(completion, ChatCompletion):
        raise response_invalid(provider, f"expected a completion, got {str(completion)[:200]!r}")
    try:
        if not completion.choices:
            raise ValueError("the completion has no choices")
        choice = completion.choices[0]
        reply = choice.message
        content: list[ContentBlock] = [TextContent(text=reply.content)] if reply.content else []
        stop = FINISH_REASONS.get(choice.finish_reason, StopReason.END_TURN)
        if reply.refusal:
            content.append(TextContent(text=reply.refusal))
            stop = StopReason.SAFETY
        calls = {
            bounded_call_id(call.id): tool_call(call.function.name, call.function.arguments)
            for call in reply.tool_calls or []
            if isinstance(call, ChatCompletionMessageFunctionToolCall)
        }
        extra = reply.model_extra or {}
        reasoning = [extra[f] for f in REASONING_FIELDS if isinstance(extra.get(f), str)]
        message = Message(
            role="assistant",
            content=content,
            tool_calls=calls or None,
            channels={"reasoning": [TextContent(text=reasoning[0])]} if reasoning else None,
            stop_reason=stop,
        )
        return with_usage(message, usage_of(completion.usage))
    except (AttributeError, TypeError, ValueError) as err:  # pydantic's errors are ValueErrors
        raise response_invalid(provider, f"{type(err).__name__}: {err}") from None


def usage_of(usage: CompletionUsage | None) -> Usage:
    """Token counts in Anthropic's sense, so totals mean the same across providers:
    ``input_tokens`` excludes the prompt tokens served from cache (OpenAI counts them in)."""
    if usage is None:
        return Usage()
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens if details else None) or 0
    return Usage(
        input_tokens=max(0, usage.prompt_tokens - cached),
        output_tokens=usage.completion_tokens,
        cache_read_tokens=cached,
    )
