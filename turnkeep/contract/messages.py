"""The message data contract: what a conversation is made of, on the wire and in Python.

These models mirror MCP's JSON (content blocks, ``CallToolResult``) and fast-agent's
``PromptMessageExtended`` (``tool_calls``, ``tool_results``, ``channels``, ``stop_reason``), but
are defined here rather than imported from ``mcp``: workflow code must stay light and
deterministic inside Temporal's sandbox, and the wire format must not move when the MCP SDK's
Python names do. Conversion to and from the SDK types happens outside workflow code, in the
providers and the tool activities.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StopReason(StrEnum):
    """Why the model stopped; same spellings as fast-agent's ``LlmStopReason``."""

    END_TURN = "endTurn"
    STOP_SEQUENCE = "stopSequence"
    MAX_TOKENS = "maxTokens"
    TOOL_USE = "toolUse"
    PAUSE = "pause"
    ERROR = "error"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    SAFETY = "safety"
    MAX_ITERATIONS = "maxIterations"


class _Wire(BaseModel):
    # MCP spells fields in camelCase on the wire; accept both spellings, emit the wire one, and
    # keep unknown fields (annotations, _meta, ...) so a round trip through turnkeep loses nothing.
    model_config = ConfigDict(
        extra="allow", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )


class TextContent(_Wire):
    type: Literal["text"] = "text"
    text: str


class ImageContent(_Wire):
    type: Literal["image"] = "image"
    data: str  # base64
    mime_type: str = Field(alias="mimeType")


class AudioContent(_Wire):
    type: Literal["audio"] = "audio"
    data: str  # base64
    mime_type: str = Field(alias="mimeType")


class EmbeddedResource(_Wire):
    type: Literal["resource"] = "resource"
    resource: dict[str, Any]  # {uri, mimeType, text | blob}


class ResourceLink(_Wire):
    type: Literal["resource_link"] = "resource_link"
    uri: str
    name: str
    mime_type: str | None = Field(default=None, alias="mimeType")


ContentBlock = Annotated[
    TextContent | ImageContent | AudioContent | EmbeddedResource | ResourceLink,
    Field(discriminator="type"),
]


class CallToolResult(_Wire):
    content: list[ContentBlock] = Field(default_factory=list)
    is_error: bool = Field(default=False, alias="isError")
    structured_content: dict[str, Any] | None = Field(default=None, alias="structuredContent")

    @classmethod
    def error(cls, message: str) -> CallToolResult:
        return cls(content=[TextContent(text=message)], is_error=True)

    @property
    def text(self) -> str:
        return joined_text(self.content)


class ToolCall(BaseModel):
    """One tool call the model asked for (MCP's ``CallToolRequestParams``)."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    # Set by a provider adapter when the model's arguments were not a JSON object; the loop then
    # answers the call with an isError result instead of running the tool with made-up input.
    invalid_arguments: str | None = None


class Message(BaseModel):
    role: Literal["user", "assistant"]
    content: list[ContentBlock] = Field(default_factory=list)
    tool_calls: dict[str, ToolCall] | None = None
    tool_results: dict[str, CallToolResult] | None = None
    channels: dict[str, list[ContentBlock]] | None = None
    stop_reason: StopReason | None = None

    @classmethod
    def user(cls, text: str) -> Message:
        return cls(role="user", content=[TextContent(text=text)])

    @classmethod
    def assistant(cls, text: str, stop_reason: StopReason = StopReason.END_TURN) -> Message:
        return cls(role="assistant", content=[TextContent(text=text)], stop_reason=stop_reason)

    @property
    def text(self) -> str:
        return joined_text(self.content)

    def channel_json(self, name: str) -> Any:
        """The JSON value carried by a channel as its first text block, or None."""
        for block in (self.channels or {}).get(name, []):
            if isinstance(block, TextContent):
                return json.loads(block.text)
        return None


# A message's fields that are None unless set: a payload leaves them out when they are.
_UNSET_WHEN_NONE = ("tool_calls", "tool_results", "channels", "stop_reason")


def compact_message(data: dict[str, Any]) -> None:
    """Leave out of a message dumped for a payload the fields that hold None (their default):
    a conversation's payloads hold many messages, most of them text alone."""
    for name in _UNSET_WHEN_NONE:
        if name in data and data[name] is None:
            del data[name]


def message_json(message: Message) -> str:
    """A message's JSON as a payload holds it, its unset fields left out (``compact_message``)."""
    unset = {name for name in _UNSET_WHEN_NONE if getattr(message, name) is None}
    return message.model_dump_json(exclude=unset)


def joined_text(blocks: list[ContentBlock]) -> str:
    return "\n".join(block.text for block in blocks if isinstance(block, TextContent))


def json_channel(value: Any) -> list[ContentBlock]:
    """A channel whose content is one JSON text block (how fast-agent carries tool_timing)."""
    return [TextContent(text=json.dumps(value, sort_keys=True))]


def estimate_tokens(messages: list[Message]) -> int:
    """A rough token count (4 characters a token), for models that don't report one and for
    deciding when to compact."""
    return sum(estimate_chars(m) for m in messages) // 4


def estimate_chars(message: Message) -> int:
    """What one message counts for in ``estimate_tokens``."""
    return len(message.model_dump_json(exclude_none=True))
