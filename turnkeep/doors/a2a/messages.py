"""A2A's messages as turnkeep's and back: what a client sends (text for a turn, or decisions on
calls waiting for approval, as data parts or plain "approve"/"deny"), validated before anything
starts; and what the server answers (a turn's messages, the calls waiting and how to answer
them, the answer as an artifact). No Temporal here: the handler does the asking."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from a2a.types.a2a_pb2 import Artifact, Message, Part, Role
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from google.protobuf import json_format, struct_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnkeep.contract.approval import PendingCall
from turnkeep.contract.messages import Message as TurnMessage
from turnkeep.contract.messages import json_channel

# The channel a user message sent over A2A carries its A2A message id in: its history shows it
# under that id, and a worker's hooks can see which A2A message a turn answers.
A2A_CHANNEL = "a2a"

MAX_TEXT = 100_000  # characters of one message's text
MAX_PARTS = 32
MAX_MESSAGE_ID = 200  # characters of a client's message id kept with its message
# A plain-text answer to a call waiting: "approve", or "deny" with an optional reason.
_TEXT_DECISION = re.compile(r"\s*(approve|deny)\b[\s:,.-]*(.*)", re.IGNORECASE | re.DOTALL)


# --- what a client sends ------------------------------------------------------------------------


class DecisionPart(BaseModel):
    """A data part deciding a call that waits for approval."""

    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1, max_length=200)
    approve: bool
    reason: str | None = Field(default=None, max_length=2_000)
    # Approve the call with these arguments instead of the model's.
    arguments: dict[str, Any] | None = None


class Incoming(BaseModel):
    """A client's message, validated: text for a turn, or decisions on waiting calls."""

    text: str = Field(default="", max_length=MAX_TEXT)
    decisions: list[DecisionPart] = Field(default_factory=list)


def read_message(message: Message) -> Incoming:
    """The message's text and decisions; raises ``InvalidParamsError`` naming what is wrong."""
    if message.role != Role.ROLE_USER:
        raise InvalidParamsError(message="the message's role must be ROLE_USER")
    if not message.parts:
        raise InvalidParamsError(message="the message has no parts")
    if len(message.parts) > MAX_PARTS:
        raise InvalidParamsError(message=f"the message has more than {MAX_PARTS} parts")
    texts: list[str] = []
    decisions: list[Any] = []
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            decisions.append(_whole_numbers(json_format.MessageToDict(part.data)))
        elif kind in ("raw", "url"):
            # A2A's error for content the agent does not take (its card's input modes).
            raise ContentTypeNotSupportedError(
                message=f"part {index} is a file ({kind}): only text and data parts are taken"
            )
        else:
            raise InvalidParamsError(
                message=f"part {index} is {kind or 'empty'}: only text and data parts are taken"
            )
    try:
        return Incoming.model_validate({"text": "\n".join(texts), "decisions": decisions})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidParamsError(message=f"invalid message: {where}: {first['msg']}") from None


def _whole_numbers(value: Any) -> Any:
    """A data part's JSON with whole numbers as ints: protobuf's ``Value`` makes every number
    a double, and edited arguments go to tools that expect ``3``, not ``3.0``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def text_decisions(text: str, waiting: Sequence[PendingCall]) -> list[DecisionPart]:
    """A plain-text answer to the calls waiting: "approve" or "deny[: reason]", for them all."""
    match = _TEXT_DECISION.fullmatch(text)
    if match is None:
        names = ", ".join(f"{c.name} ({c.call_id})" for c in waiting)
        raise InvalidParamsError(
            message=f"calls wait for a decision ({names}): answer approve or deny, "
            'or a data part {"call_id", "approve"}'
        )
    approve = match.group(1).lower() == "approve"
    reason = match.group(2).strip() or None
    return [
        DecisionPart(call_id=c.call_id, approve=approve, reason=None if approve else reason)
        for c in waiting
    ]


def user_message(text: str, message_id: str) -> TurnMessage:
    """The turn's user message for an A2A message: its text, and its id in the ``a2a``
    channel (a model never sees channels)."""
    message = TurnMessage.user(text)
    if 0 < len(message_id) <= MAX_MESSAGE_ID:  # a longer one is the client's to keep
        message.channels = {A2A_CHANNEL: json_channel({"message_id": message_id})}
    return message


def text_answer_field(call: PendingCall) -> str | None:
    """The one string field a plain-text answer fills for an elicitation that asks for one
    (``ctx.elicit(..., response_type=str)`` asks for ``value``); None if it asks for more."""
    schema = call.requested_schema or {}
    properties = schema.get("properties") or {}
    if call.kind != "elicitation" or len(properties) != 1:
        return None
    ((name, field),) = properties.items()
    return name if isinstance(field, dict) and field.get("type") == "string" else None


def _a2a_id(message: TurnMessage) -> str | None:
    try:
        value = message.channel_json(A2A_CHANNEL)
    except ValueError:
        return None
    given = value.get("message_id") if isinstance(value, dict) else None
    return given if isinstance(given, str) and given else None


# --- what the server answers -------------------------------------------------------------------


def _data(value: Any) -> Part:
    return Part(data=json_format.ParseDict(value, struct_pb2.Value()))


def agent_message(task_id: str, context_id: str, message_id: str, parts: Sequence[Part]) -> Message:
    """A message of the agent's in task ``task_id``."""
    return Message(
        message_id=message_id,
        task_id=task_id,
        context_id=context_id,
        role=Role.ROLE_AGENT,
        parts=list(parts),
    )


def to_a2a(message: TurnMessage, task_id: str, context_id: str, message_id: str) -> Message | None:
    """A turn's message as A2A's: its text, and its tool calls or results as data parts;
    None when it has neither."""
    parts: list[Part] = []
    if message.text:
        parts.append(Part(text=message.text))
    if message.tool_calls:
        calls = [
            {"call_id": call_id, "name": call.name, "arguments": call.arguments}
            for call_id, call in message.tool_calls.items()
        ]
        parts.append(_data({"tool_calls": calls}))
    if message.tool_results:
        results = [
            {"call_id": call_id, "is_error": result.is_error, "text": result.text}
            for call_id, result in message.tool_results.items()
        ]
        parts.append(_data({"tool_results": results}))
    if not parts:
        return None
    role = (
        Role.ROLE_USER if message.role == "user" and not message.tool_results else Role.ROLE_AGENT
    )
    return Message(
        message_id=message_id, task_id=task_id, context_id=context_id, role=role, parts=parts
    )


def to_history(task_id: str, context_id: str, messages: Sequence[TurnMessage]) -> list[Message]:
    """A turn's messages as its task's history: a client's message under its own id, the
    others by index (the same on every read)."""
    return [
        converted
        for i, m in enumerate(messages)
        if (converted := to_a2a(m, task_id, context_id, _a2a_id(m) or f"{task_id}/{i}")) is not None
    ]


def approval_message(task_id: str, context_id: str, calls: Sequence[PendingCall]) -> Message:
    """The ``input-required`` status message: each waiting call with its arguments, and how to
    answer."""
    if calls and all(text_answer_field(c) for c in calls):
        asked = "\n".join(f"- {c.prompt or c.name} (call {c.call_id})" for c in calls)
        text = f"Waiting for your answer:\n{asked}\nAnswer with text."
    else:
        listed = "\n".join(f"- {c.name} (call {c.call_id}): {_json(c.arguments)}" for c in calls)
        text = (
            f"Waiting for approval:\n{listed}\n"
            'Answer "approve" or "deny: <reason>" (every call listed), or one data part per '
            'call: {"call_id": ..., "approve": true|false, "reason": ..., "arguments": {...}}.'
        )
    waiting = [c.model_dump(mode="json", exclude_none=True) for c in calls]
    ids = "-".join(c.call_id for c in calls)
    return agent_message(
        task_id,
        context_id,
        f"{task_id}/approval/{ids}",
        [Part(text=text), _data({"approvals": waiting})],
    )


def _json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 2_000 else text[:1_999] + "…"


def answer_artifact(turn: str, text: str) -> Artifact:
    """A turn's answer as the task's ``answer`` artifact."""
    return Artifact(artifact_id=f"answer-{turn}", name="answer", parts=[Part(text=text)])
