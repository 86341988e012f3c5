"""Example hooks (fast-agent's ToolRunner hook points, run as Temporal activities).

Register them in turnkeep.yaml and enable them per agent:

    hooks:
      tool_budget: examples.hooks:tool_budget
      audit_log: examples.hooks:audit_log
    agents:
      demo:
        hooks:
          before_tool_call: [tool_budget]
          after_turn_complete: [audit_log]

A hook gets a ``HookContext`` (hook point, agent, model, iteration, this turn's messages, the
last message, usage so far) and returns a ``HookChange`` — or None for no change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from turnkeep import HookChange, HookContext, Message, StopReason

MAX_TOOL_CALLS = int(os.environ.get("TURNKEEP_TOOL_BUDGET", "8"))


def tool_budget(context: HookContext) -> HookChange | None:
    """before_tool_call: stop a turn that has asked for more tools than its budget.

    The calls that would exceed it are answered as not run, so the conversation stays valid,
    and the turn ends with stop reason `pause` so a caller can decide whether to go on."""
    asked = sum(len(m.tool_calls or {}) for m in context.messages if m.role == "assistant")
    if asked <= MAX_TOOL_CALLS:
        return None
    note = Message.assistant(
        f"Stopping: this turn asked for {asked} tool calls, over its budget of {MAX_TOOL_CALLS}.",
        StopReason.PAUSE,
    )
    return HookChange(stop_reason=StopReason.PAUSE, append=[note])


def audit_log(context: HookContext) -> None:
    """after_turn_complete: append one JSON line per finished turn to $TURNKEEP_AUDIT_LOG.

    Its ``last_message`` is the turn's final answer, whose stop reason says how the turn ended
    (``maxIterations`` for a capped one, though the results of its last tools come after it).
    It does I/O, which is why hooks run as activities (a plain function runs in a thread); a
    failure here is logged and ignored."""
    path = Path(os.environ.get("TURNKEEP_AUDIT_LOG", "turnkeep-audit.jsonl"))
    record = {
        "agent": context.agent,
        "model": context.model,
        "iterations": context.iteration,
        "stop_reason": context.last_message.stop_reason if context.last_message else None,
        "tokens": {model: u.model_dump() for model, u in context.usage.items()},
    }
    with path.open("a", encoding="utf-8") as log:
        log.write(json.dumps(record) + "\n")
