"""How a ``SessionWorkflow`` hands its conversation to each turn and takes the turn's outcome
back, without converting the whole conversation each turn.

A session of a thousand turns holds a conversation of thousands of messages. Converting it into
a turn's input and back out of the turn's result on every turn (as ``TurnInput`` and
``TurnResult`` objects) would make the session's own workflow task slower to start each turn
the longer the session has run (the benchmarks' ``sessions`` section). So the session
keeps each message's JSON once it has it and writes a turn's input by joining them
(``ConversationJson``); it reads back only what a turn added (``TurnOutcome``: the turn's
``messages`` and usage, with its ``history`` skipped unparsed) unless the turn rewrote the
conversation (a compaction), the one case in which it takes the whole ``history`` again.

The input is still one payload like any turn's: over ``payload_storage.threshold_bytes`` it is
kept in payload storage with only a reference in the histories of the session and of the turn,
and the turn checks it as it checks any client's input.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

from turnkeep.workflows.messages import Message
from turnkeep.workflows.turn_io import HistoryChange, TurnResult, Usage

Model = TypeVar("Model", bound=BaseModel)

# The payload converter's encoding for JSON (what it would write for a ``TurnInput``).
_JSON_ENCODING = b"json/plain"


class TurnOutcome(BaseModel):
    """The parts of a ``TurnResult`` a session takes in after each turn. Decoding a result as
    this skips its ``history`` (the whole conversation) without building it."""

    messages: list[Message]
    usage: dict[str, Usage] = Field(default_factory=dict)
    history_change: HistoryChange = HistoryChange.APPENDED


class ConversationJson:
    """The JSON of each message of a session's conversation, dumped once per message: the
    next turn's input is then a join, not a dump of the whole conversation."""

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._json: list[str] = []

    def turn_input(self, agent: str, history: list[Message], messages: list[Message]) -> RawValue:
        """A ``TurnInput`` for ``agent`` answering ``messages`` after ``history``, as the
        payload the converter would write for it."""
        self._cover(history)
        text = (
            f'{{"agent":{json.dumps(agent)},'
            f'"messages":[{",".join(m.model_dump_json() for m in messages)}],'
            f'"history":[{",".join(self._json)}]}}'
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
        self._json.extend(m.model_dump_json() for m in history[kept:])


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
