"""Model providers: one module each, all answering an ``LlmRequest`` with an assistant
``Message`` (stop reason, tool calls, and a ``usage`` channel)."""

from __future__ import annotations

from typing import Protocol

from turnkeep.workflows.activity_io import LlmRequest
from turnkeep.workflows.messages import Message, json_channel
from turnkeep.workflows.turn_io import Usage


class ModelProvider(Protocol):
    async def complete(self, request: LlmRequest, model_name: str) -> Message: ...

    async def aclose(self) -> None:
        """Release connections (at worker shutdown)."""


def with_usage(message: Message, usage: Usage) -> Message:
    """Attach usage the way every provider reports it: as the ``usage`` channel."""
    channels = dict(message.channels or {})
    channels["usage"] = json_channel(usage.model_dump(exclude={"calls"}))
    return message.model_copy(update={"channels": channels})
