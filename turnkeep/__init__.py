"""turnkeep: durable agent turns on Temporal.

The public API: what an application imports to run turns (the plugin, ``Agent``, a client's
``start_turn`` and ``open_session``), and what it extends (``ModelProvider``, ``ToolSource``,
hooks and approval policies). ``turnkeep.in_workflow`` is the API for an application's own
workflow code and ``turnkeep.testing`` the kit for its tests; every other module is internal.

Names are imported on first use (PEP 562), so importing a submodule, as the workflow sandbox
does with ``turnkeep.workflows``, loads none of the SDKs or I/O code behind the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnkeep.activities.hooks import Hook
    from turnkeep.client.children import ChildEnded, ChildStarted, ChildText, ChildTurn
    from turnkeep.client.connection import connect
    from turnkeep.client.live import (
        MessageEvent,
        Restarted,
        StreamEvent,
        TextDelta,
        ToolCallStart,
    )
    from turnkeep.client.plugin import TurnkeepClientPlugin
    from turnkeep.client.sessions import SessionHandle, get_session, open_session
    from turnkeep.client.turns import TurnHandle, get_turn, start_turn
    from turnkeep.config.agents import Agent, Approval, ClientTool, McpServer
    from turnkeep.config.files import load_settings
    from turnkeep.config.settings import Settings
    from turnkeep.contract.activity_io import HookChange, HookContext, HookPoint
    from turnkeep.contract.approval import ApprovalPolicy, ApprovalRequest, PolicyDecision
    from turnkeep.contract.messages import Message, StopReason
    from turnkeep.contract.turn_io import (
        TurnCancelledError,
        TurnInput,
        TurnResult,
        agent_task_queue,
    )
    from turnkeep.fastagent.request_params import RequestParams
    from turnkeep.providers.base import ModelProvider
    from turnkeep.tools.source import ToolSource
    from turnkeep.worker.build import build_worker, build_workers
    from turnkeep.worker.plugin import TurnkeepPlugin

# name -> the module that defines it
_EXPORTS = {
    "Agent": "turnkeep.config.agents",
    "Approval": "turnkeep.config.agents",
    "ClientTool": "turnkeep.config.agents",
    "McpServer": "turnkeep.config.agents",
    "RequestParams": "turnkeep.fastagent.request_params",
    "Settings": "turnkeep.config.settings",
    "load_settings": "turnkeep.config.files",
    "TurnkeepPlugin": "turnkeep.worker.plugin",
    "build_worker": "turnkeep.worker.build",
    "build_workers": "turnkeep.worker.build",
    "TurnkeepClientPlugin": "turnkeep.client.plugin",
    "connect": "turnkeep.client.connection",
    "TurnHandle": "turnkeep.client.turns",
    "get_turn": "turnkeep.client.turns",
    "start_turn": "turnkeep.client.turns",
    "SessionHandle": "turnkeep.client.sessions",
    "get_session": "turnkeep.client.sessions",
    "open_session": "turnkeep.client.sessions",
    "MessageEvent": "turnkeep.client.live",
    "ChildStarted": "turnkeep.client.children",
    "ChildEnded": "turnkeep.client.children",
    "ChildText": "turnkeep.client.children",
    "ChildTurn": "turnkeep.client.children",
    "Restarted": "turnkeep.client.live",
    "StreamEvent": "turnkeep.client.live",
    "TextDelta": "turnkeep.client.live",
    "ToolCallStart": "turnkeep.client.live",
    "Message": "turnkeep.contract.messages",
    "StopReason": "turnkeep.contract.messages",
    "TurnCancelledError": "turnkeep.contract.turn_io",
    "TurnInput": "turnkeep.contract.turn_io",
    "TurnResult": "turnkeep.contract.turn_io",
    "agent_task_queue": "turnkeep.contract.turn_io",
    # What an application extends: its own model providers, kinds of tool server, hooks and
    # approval policies.
    "ModelProvider": "turnkeep.providers.base",
    "ToolSource": "turnkeep.tools.source",
    "Hook": "turnkeep.activities.hooks",
    "HookChange": "turnkeep.contract.activity_io",
    "HookContext": "turnkeep.contract.activity_io",
    "HookPoint": "turnkeep.contract.activity_io",
    "ApprovalPolicy": "turnkeep.contract.approval",
    "ApprovalRequest": "turnkeep.contract.approval",
    "PolicyDecision": "turnkeep.contract.approval",
}

__all__ = [
    "Agent",
    "Approval",
    "ApprovalPolicy",
    "ApprovalRequest",
    "ChildEnded",
    "ChildStarted",
    "ChildText",
    "ChildTurn",
    "ClientTool",
    "Hook",
    "HookChange",
    "HookContext",
    "HookPoint",
    "McpServer",
    "Message",
    "MessageEvent",
    "ModelProvider",
    "PolicyDecision",
    "RequestParams",
    "Restarted",
    "SessionHandle",
    "Settings",
    "StopReason",
    "StreamEvent",
    "TextDelta",
    "ToolCallStart",
    "ToolSource",
    "TurnCancelledError",
    "TurnHandle",
    "TurnInput",
    "TurnResult",
    "TurnkeepClientPlugin",
    "TurnkeepPlugin",
    "agent_task_queue",
    "build_worker",
    "build_workers",
    "connect",
    "get_session",
    "get_turn",
    "load_settings",
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
