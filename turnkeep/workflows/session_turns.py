"""How a ``SessionWorkflow`` hands its conversation to each turn and takes the turn's outcome
back, without converting the whole conversation each turn.

Once the conversation is stored (``turnkeep.contract.conversation``: a worker whose data
converter stores segments, which turnkeep's do with payload storage on), a turn's input names
it by reference and the turn's result hands back its own messages as a stored segment and the
conversation by reference: what the histories of the session and its turns record per turn no
longer grows with the conversation. The first turn of a session (nothing to store yet) is
handed an empty reference; a session whose first turn comes back without a reference (payload
storage off) hands every turn its conversation itself, as JSON kept per message
(``ConversationJson``), and reads back only what a turn added (``TurnOutcome``) unless the turn
rewrote the conversation (a compaction).
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

from turnkeep.contract.approval import AllowRule
from turnkeep.contract.conversation import ConversationRef, input_segment
from turnkeep.contract.messages import Message, message_json
from turnkeep.contract.turn_io import HistoryChange, Spent, TaskPriority, TurnResult, Usage

Model = TypeVar("Model", bound=BaseModel)

# The payload converter's encoding for JSON (what it would write for a ``TurnInput``).
_JSON_ENCODING = b"json/plain"


class TurnOutcome(BaseModel):
    """The parts of a ``TurnResult`` a session takes in after each turn. Decoding a result as
    this skips its ``history`` (the whole conversation) without building it."""

    messages: list[Message]
    usage: dict[str, Usage] = Field(default_factory=dict)
    history_change: HistoryChange = HistoryChange.APPENDED
    # The session's stored conversation after the turn, when the turn stored its messages.
    conversation: ConversationRef | None = None
    budget_raised: float = 0.0
    session_budget: bool = False
    # The rules the turn knew: the session's it was handed, and those its decisions set.
    allow_rules: list[AllowRule] = Field(default_factory=list)


class ConversationJson:
    """The JSON of each message of a session's conversation, dumped once per message: the
    next turn's input is then a join, not a dump of the whole conversation."""

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._json: list[str] = []

    def turn_input(
        self,
        agent: str,
        history: list[Message],
        messages: list[Message],
        ref: ConversationRef | None = None,
        spent: Spent | None = None,
        rules: list[AllowRule] | None = None,
        model: str | None = None,
        *,
        priority: TaskPriority | None = None,
        tenant: str | None = None,
    ) -> RawValue:
        """A ``TurnInput`` for ``agent`` answering ``messages`` after the conversation: by
        reference when it is stored (``ref``; the data converter expands it), else
        ``history`` itself, with the session's active ``rules``. As the payload the converter
        would write for it. With a reference, ``messages`` go in a segment to store too (the
        turn's own goes on from it): inline, they would be recorded twice, in the session's
        start of the child and in the turn's own start. ``priority`` and ``tenant``: the
        session's, for each of its turns."""
        # A budget per session: what the earlier turns spent (only once a turn said so).
        extra = "" if spent is None else f',"session_spent":{spent.model_dump_json()}'
        if model is not None:  # a session that names one (a fork's `--model`)
            extra += f',"model":{json.dumps(model)}'
        # Only when the session has them: a session without them starts its turns as before.
        if priority is not None:
            extra += f',"priority":{json.dumps(priority)}'
        if tenant is not None:
            extra += f',"tenant":{json.dumps(tenant)}'
        # Only when the session has some: the turns of a session without rules are as before.
        allow = (
            f',"allow_rules":[{",".join(r.model_dump_json(exclude_defaults=True) for r in rules)}]'
            if rules
            else ""
        )
        if ref is not None:
            segment = input_segment(ref, messages)
            new = json.dumps(segment.marker(), separators=(",", ":"))
            extra += f',"messages_segment":"{segment.digest}"'
            marker = json.dumps(ref.sibling_marker("history_ref"), separators=(",", ":"))
            text = (
                f'{{"agent":{json.dumps(agent)},"messages":{new}{allow},"history":{marker},'
                f'"history_ref":{ref.model_dump_json()}{extra}}}'
            )
        else:
            self._cover(history)
            new = f"[{','.join(message_json(m) for m in messages)}]"
            text = (
                f'{{"agent":{json.dumps(agent)},"messages":{new}{allow},'
                f'"history":[{",".join(self._json)}]{extra}}}'
            )
        return RawValue(Payload(metadata={"encoding": _JSON_ENCODING}, data=text.encode()))

    def _cover(self, history: list[Message]) -> None:
        """Bring the kept JSON in line with ``history``: extended when it only grew (the
        messages already kept are the same objects), dumped anew when it was replaced."""
        kept = len(self._messages)
        grew = len(history) >= kept and all(
            a is b for a, b in zip(history[:kept], self._messages, strict=True)
        )
        if not grew:
            self._messages, self._json, kept = [], [], 0
        self._messages.extend(history[kept:])
        self._json.extend(message_json(m) for m in history[kept:])


def take_in(history: list[Message], outcome: TurnOutcome, full: RawValue) -> list[Message]:
    """The conversation after a turn that started from ``history`` and ended with ``outcome``
    (``full``: its whole result, decoded only when the turn rewrote the conversation)."""
    if outcome.history_change is HistoryChange.APPENDED:
        return [*history, *outcome.messages]
    if outcome.history_change is HistoryChange.UNCHANGED:
        return history
    return decode(full, TurnResult).history


def decode(value: RawValue, model: type[Model]) -> Model:
    result: Model = workflow.payload_converter().from_payload(value.payload, model)
    return result
