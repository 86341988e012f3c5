"""Content conversions the provider adapters share: a model's tool call (id, name, arguments)
into a ``ToolCall``, and MCP content into the text and image blocks chat APIs accept."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from turnkeep.contract.messages import (
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    ToolCall,
)
from turnkeep.contract.turn_io import NAME_MAX_CHARS

# Providers' call ids are some 30 characters. A longer one would be copied into every summary,
# history event and request of the turn; anything past this bound is replaced.
CALL_ID_MAX_CHARS = 128


def bounded_call_id(raw: str) -> str:
    """The model's id for a tool call, or for an over-long one a short id derived from it: the
    same on every attempt, and it is the id turnkeep keys the call's result by and sends back
    to the model, so the model sees a consistent exchange."""
    if len(raw) <= CALL_ID_MAX_CHARS:
        return raw
    return "call_" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def bounded_tool_name(raw: str) -> str:
    """The tool name the model asked for, cut short past ``NAME_MAX_CHARS``: no tool has such a
    name (the ellipsis sees to that), so the loop answers the call as one for an unknown tool,
    naming it in a message of readable size."""
    return raw if len(raw) <= NAME_MAX_CHARS else raw[: NAME_MAX_CHARS - 1] + "…"


def tool_call(name: str, raw: object) -> ToolCall:
    """A tool call from the model's arguments: a JSON object (or its text) is used as is;
    anything else is kept as ``invalid_arguments`` for the loop to answer with an error."""
    name = bounded_tool_name(name)
    arguments = raw
    if isinstance(raw, str):
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except ValueError:
            arguments = None
    if isinstance(arguments, dict):
        return ToolCall(name=name, arguments=arguments)
    return ToolCall(name=name, invalid_arguments=raw if isinstance(raw, str) else json.dumps(raw))


def plain_blocks(blocks: Sequence[ContentBlock]) -> list[TextContent | ImageContent]:
    """Content as the text and image blocks both chat APIs accept; other MCP blocks (audio,
    resources) become text saying what they were, so the model at least knows they exist."""
    out: list[TextContent | ImageContent] = []
    for block in blocks:
        if isinstance(block, TextContent | ImageContent):
            out.append(block)
        elif isinstance(block, EmbeddedResource):
            resource: dict[str, Any] = block.resource
            if isinstance(resource.get("text"), str):
                out.append(TextContent(text=resource["text"]))
            elif str(resource.get("mimeType", "")).startswith("image/") and resource.get("blob"):
                out.append(ImageContent(data=resource["blob"], mime_type=resource["mimeType"]))
            else:
                out.append(TextContent(text=f"[resource {resource.get('uri', '')} omitted]"))
        elif isinstance(block, ResourceLink):
            out.append(TextContent(text=f"[resource link: {block.name} {block.uri}]"))
        else:
            out.append(TextContent(text=f"[{block.type} content omitted]"))
    return [b for b in out if not (isinstance(b, TextContent) and not b.text)]


def result_blocks(result: CallToolResult) -> list[TextContent | ImageContent]:
    """A tool result's content; a result that only has ``structuredContent`` is sent as its
    JSON, as MCP asks servers to do themselves."""
    blocks = plain_blocks(result.content)
    if not blocks and result.structured_content is not None:
        blocks = [TextContent(text=json.dumps(result.structured_content))]
    return blocks
