"""The TCK fixture agent's script: the TCK names the behaviour it wants in each message's id
(``tck-<scenario>-<run>``, its Gherkin scenarios), which the A2A door keeps in the turn's user
message (the ``a2a`` channel). Before the turn's first model call, this hook answers as the
scenario says and ends the turn; a scenario that waits for input goes on to the model, which
asks the user through the ``ask`` tool (``sut.respond``)."""

from __future__ import annotations

import os
import time

from turnkeep.contract.activity_io import HookChange, HookContext
from turnkeep.contract.messages import Message, StopReason

# Scenario (the message id's prefix) -> the agent's answer; the longest prefix wins.
ANSWERS = {
    "tck-complete-task": "Hello from TCK",
    "tck-artifact-text": "Generated text content",
    "tck-stream-001": "Stream hello from TCK",
    "tck-stream-002": "Hello from TCK",
    "tck-stream-003": "Stream task lifecycle",
    "tck-stream-ordering-001": "Ordered output",
    "tck-stream-artifact-text": "Streamed text content",
}
DEFAULT = "Hello from TCK"
WAITS_FOR_INPUT = "tck-input-required"
# The TCK's resubscription test needs a task that runs for twice its streaming timeout.
LONG_RUNNING = "test-resubscribe-message-id"


def message_id(context: HookContext) -> str:
    """The A2A message id of the turn's (first) user message, or ''."""
    for message in context.messages:
        if message.role == "user" and not message.tool_results:
            value = message.channel_json("a2a") if message.channels else None
            if isinstance(value, dict):
                return str(value.get("message_id") or "")
    return ""


def scripted(context: HookContext) -> HookChange | None:
    """before_llm_call: answer as the message id's scenario says, or let the model ask."""
    given = message_id(context)
    if given.startswith(WAITS_FOR_INPUT):
        return None
    if given.startswith(LONG_RUNNING):
        time.sleep(2.5 * float(os.environ.get("TCK_STREAMING_TIMEOUT", "2.0")))
    prefix = max((p for p in ANSWERS if given.startswith(p)), key=len, default=None)
    answer = Message.assistant(ANSWERS[prefix] if prefix else DEFAULT)
    return HookChange(append=[answer], stop_reason=StopReason.END_TURN)
