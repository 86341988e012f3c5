"""turnkeep: durable agent turns on Temporal.

The public API. Names are imported on first use (PEP 562), so importing a submodule, as the
workflow sandbox does with ``turnkeep.workflows``, loads none of the SDKs or I/O code behind
the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnkeep.agents import Agent, Approval, McpServer
    from turnkeep.fastagent.request_params import RequestParams
    from turnkeep.settings import Settings
    from turnkeep.worker.build import build_worker
    from turnkeep.worker.client import TurnHandle, get_turn, start_turn
    from turnkeep.worker.connection import connect
    from turnkeep.worker.live_stream import (
        MessageEvent,
        Restarted,
        StreamEvent,
        TextDelta,
        ToolCallStart,
    )
    from turnkeep.worker.plugin import TurnkeepClientPlugin, TurnkeepPlugin
    from turnkeep.worker.session import SessionHandle, open_session
    from turnkeep.workflows.approval import ApprovalRequest, PolicyDecision
    from turnkeep.workflows.messages import Message, StopReason
    from turnkeep.workflows.turn_io import TurnCancelledError, TurnInput, TurnResult

# name -> the module that defines it
_EXPORTS = {
    "Agent": "turnkeep.agents",
    "Approval": "turnkeep.agents",
    "McpServer": "turnkeep.agents",
    "RequestParams": "turnkeep.fastagent.request_params",
    "Settings": "turnkeep.settings",
    "build_worker": "turnkeep.worker.build",
    "TurnHandle": "turnkeep.worker.client",
    "get_turn": "turnkeep.worker.client",
    "start_turn": "turnkeep.worker.client",
    "connect": "turnkeep.worker.connection",
    "MessageEvent": "turnkeep.worker.live_stream",
    "Restarted": "turnkeep.worker.live_stream",
    "StreamEvent": "turnkeep.worker.live_stream",
    "TextDelta": "turnkeep.worker.live_stream",
    "ToolCallStart": "turnkeep.worker.live_stream",
    "TurnkeepClientPlugin": "turnkeep.worker.plugin",
    "TurnkeepPlugin": "turnkeep.worker.plugin",
    "SessionHandle": "turnkeep.worker.session",
    "open_session": "turnkeep.worker.session",
    "ApprovalRequest": "turnkeep.workflows.approval",
    "PolicyDecision": "turnkeep.workflows.approval",
    "Message": "turnkeep.workflows.messages",
    "StopReason": "turnkeep.workflows.messages",
    "TurnCancelledError": "turnkeep.workflows.turn_io",
    "TurnInput": "turnkeep.workflows.turn_io",
    "TurnResult": "turnkeep.workflows.turn_io",
}

__all__ = [
    "Agent",
    "Approval",
    "ApprovalRequest",
    "McpServer",
    "Message",
    "MessageEvent",
    "PolicyDecision",
    "RequestParams",
    "Restarted",
    "SessionHandle",
    "Settings",
    "StopReason",
    "StreamEvent",
    "TextDelta",
    "ToolCallStart",
    "TurnCancelledError",
    "TurnHandle",
    "TurnInput",
    "TurnResult",
    "TurnkeepClientPlugin",
    "TurnkeepPlugin",
    "build_worker",
    "connect",
    "get_turn",
    "open_session",
    "start_turn",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'turnkeep' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
