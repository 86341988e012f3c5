"""A session's conversation by reference: content-addressed segments, chained.

A session runs a child turn per exchange. Handing each turn the whole conversation, and taking
it back in the turn's result, would record the conversation again for every turn: bytes
growing with the square of the session's length. Instead each turn's messages are stored once,
as a **segment**, and the session and its turns hand each other a **reference**:

- A segment holds the messages one turn appended, and two pointers: ``parent``, the last
  segment of the history that turn saw, and ``prev``, the session's previous turn's segment.
  Its digest covers both and each message's JSON, so it names its content and its place.
- The **transcript** (every turn's messages, in order) is the chain of ``prev`` pointers from
  the session's last segment.
- The **history** (what the next turn sees) is the messages of the chain of ``parent``
  pointers from ``head``, from index ``start``, after the summary of the last compaction if
  there was one (kept in the segment of the turn that compacted): a turn that compacted starts
  the history anew from its summary, one that does not use history leaves it as it was.

Workflow code only names segments and computes their digests (pure). Storing a segment and
expanding a reference back into messages happen in the data converter's codec, outside the
workflow, when a payload carries a marker (``MARKER``): a segment with its messages is stored
and stripped on the way out; a segment, a history or a transcript reference is replaced by its
messages on the way in. So a turn's code sees its history as a plain list, and what a history
records per turn no longer grows with the conversation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)

from turnkeep.contract.messages import Message, message_json

# The key that marks a reference or a segment inside a payload's JSON.
MARKER = "$turnkeep"
# The serialization context under which models write references instead of messages: set by
# the payload converter of a worker or client whose converter stores segments.
STORE_CONTEXT = "turnkeep_conversation_store"

Kind = Literal["segment", "history", "transcript"]
# The payload metadata in which the codec says where in a payload's JSON it expanded a
# reference under a top-level key: ``{"history": [start, end]}`` (byte offsets).
EXPANDED_METADATA = "turnkeep-expanded"
# The only keys it may name: the fields of type ``Messages`` (``TurnInput.history``,
# ``SessionState.history`` and ``.transcript``). Anything else in a payload is parsed, whoever
# set the metadata.
EXPANDABLE = frozenset({"history", "transcript"})


def _parsed(value: Any) -> Any:
    """A conversation the codec expanded under a top-level key arrives in a workflow's untyped
    start arguments as the bytes of its JSON (``bytes`` never comes out of parsing JSON): a
    worker that holds the conversation already (``conversation_cache``) never parses it, and
    validation parses it otherwise. Bytes, not a class of ours: the replay tests' sandbox
    imports its own copy of the workflow modules, and a class would differ from the
    converter's. Validated from JSON at once (less than half the time of parsing, then
    validating); JSON that is not valid messages is parsed for the field's own validation,
    whose errors say where."""
    if not isinstance(value, bytes):
        return value
    try:
        return _MESSAGES.validate_json(value)
    except ValidationError:
        return pydantic_core.from_json(value)


_MESSAGES = TypeAdapter(list[Message])
# A list of messages that may arrive as the bytes of its JSON.
Messages = Annotated[list[Message], BeforeValidator(_parsed)]


class ConversationRef(BaseModel):
    """Where a session's conversation is: its history is the summary held by segment
    ``summary`` (if any), then the messages of the ``parent`` chain ending at ``head`` from
    index ``start``; its transcript is the ``prev`` chain ending at ``transcript``. ``owner``
    is the session: only its own child turns may hand a turn such a reference
    (``TurnWorkflow`` checks)."""

    model_config = ConfigDict(extra="forbid")

    owner: str = Field(min_length=1)
    head: str | None = None
    start: int = Field(default=0, ge=0)
    summary: str | None = None
    transcript: str | None = None

    @model_serializer(mode="wrap")
    def _short(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Recorded for every turn: the transcript's end is the history's but after a turn
        # that did not use history, and what is absent is its default.
        data = handler(self)
        if isinstance(data, dict):
            if data.get("transcript") == data.get("head"):
                data.pop("transcript", None)
            for name in ("summary", "start"):
                if not data.get(name):
                    data.pop(name, None)
        return data

    @model_validator(mode="before")
    @classmethod
    def _transcript_at_head(cls, data: Any) -> Any:
        if isinstance(data, dict) and "transcript" not in data:
            data = {**data, "transcript": data.get("head")}
        return data

    def sibling_marker(self, key: str) -> dict[str, Any]:
        """What a payload holds in place of the history when it carries this reference under
        ``key`` beside it (a turn's input): the codec expands it from there."""
        return {MARKER: "history", "ref": key}

    def history_marker(self) -> dict[str, Any]:
        """What a payload holds in place of the history: the codec expands it."""
        return {
            MARKER: "history",
            "owner": self.owner,
            "head": self.head,
            "start": self.start,
            "summary": self.summary,
        }

    def transcript_marker(self) -> dict[str, Any]:
        return {MARKER: "transcript", "owner": self.owner, "head": self.transcript}


class Segment(BaseModel):
    """One turn's messages in a session's chain, as their JSON (each message's
    ``message_json``, its unset fields left out: what its digest is taken over), and the
    summary it compacted the conversation to, if it did."""

    owner: str
    parent: str | None
    prev: str | None
    messages: list[str]
    summary: str | None = None
    # A turn's messages begin with those of the segment its session stored them in when it
    # started the turn (``input_segment``), which is then this one's ``parent`` and ``prev``:
    # the turn's messages are that one's, then this one's, and no message is stored twice.
    # Not part of the content (the pointers are).
    follows: bool = False

    @property
    def digest(self) -> str:
        return segment_digest(self.parent, self.prev, self.messages, self.summary)

    def marker(self) -> dict[str, Any]:
        """What a payload holds in place of the segment's messages: stored and stripped on the
        way out, filled in again on the way in (after those of ``prev``, if it ``follows``)."""
        marker: dict[str, Any] = {
            MARKER: "segment",
            "owner": self.owner,
            "digest": self.digest,
            "parent": self.parent,
            "prev": self.prev,
            "messages": self.messages,
            "summary": self.summary,
        }
        if self.follows:
            marker["follows"] = True
        return marker


def input_segment(ref: ConversationRef, messages: Sequence[Message]) -> Segment:
    """The segment in which a session stores the messages it hands a turn (the turn's input),
    after the conversation ``ref`` names: the turn's input then records a reference, not the
    messages, and the turn's own segment goes on from it (``after_turn``)."""
    return Segment(
        owner=ref.owner,
        parent=ref.head,
        prev=ref.transcript,
        messages=[message_json(m) for m in messages],
    )


def unexpanded(data: dict[str, Any]) -> dict[str, Any]:
    """A session's turn input (``session_turns``) as a worker whose data converter stores no
    segments (payload storage off) receives it, made what it stands for: no codec expanded
    the first turn's empty history reference, nor stored the segment of its messages, which
    the marker still holds. Anything else is left for validation to refuse."""
    update: dict[str, Any] = {}
    segment, ref = _marker(data.get("messages"), "segment"), data.get("history_ref")
    if segment is not None and isinstance(segment.get("messages"), list):
        update["messages"] = [
            pydantic_core.from_json(text) if isinstance(text, str) else text
            for text in segment["messages"]
        ]
    if (
        _marker(data.get("history"), "history") is not None
        and isinstance(ref, dict)
        and ref.get("head") is None
        and not ref.get("summary")
    ):
        update["history"] = []
    return {**data, **update} if update else data


def _marker(value: Any, kind: Kind) -> dict[str, Any] | None:
    return value if isinstance(value, dict) and value.get(MARKER) == kind else None


def segment_digest(
    parent: str | None,
    prev: str | None,
    messages: Sequence[str],
    summary: str | None = None,
    base: tuple[str, str] | None = None,
) -> str:
    """The SHA-256 of a segment: its pointers, each message's own SHA-256 and its summary's
    (and, for a fork's first segment, the conversation it goes on from: ``base``)."""
    parts = [parent or "", prev or "", _sha256(summary) if summary else "", *map(_sha256, messages)]
    if base is not None:
        # Only a fork's segment has one: every other segment's digest stays what it was.
        parts.append(f"base:{base[0]}\x00{base[1]}")
    return _sha256("\n".join(parts))


def after_turn(
    ref: ConversationRef,
    messages: Sequence[Message],
    *,
    appended: bool,
    summary: Message | None,
    compacted_upto: int,
    given: tuple[str, int] | None = None,
) -> tuple[ConversationRef, Segment]:
    """The session's conversation after a turn that started from ``ref`` and appended
    ``messages`` (``TurnResult.messages``), and the segment that holds them.

    ``appended``: the turn's messages extend the history (it uses history); ``summary`` and
    ``compacted_upto``: a compaction replaced the turn's conversation (``ref``'s history then
    the turn's messages) before that index with this summary. ``given``: the digest of the
    segment in which the session stored the turn's input, and how many of ``messages`` begin
    with that input: the segment then holds only the messages after them, chained to that one
    (the conversation and the transcript are the same either way)."""
    texts = [message_json(m) for m in messages]
    parent, prev, follows = ref.head, ref.transcript, False
    if given is not None:
        digest, count = given
        if segment_digest(parent, prev, texts[:count]) == digest:
            parent = prev = digest
            texts, follows = texts[count:], True
    segment = Segment(
        owner=ref.owner,
        parent=parent,
        prev=prev,
        messages=texts,
        summary=message_json(summary) if summary is not None else None,
        follows=follows,
    )
    digest = segment.digest
    if summary is not None:
        # The conversation was `[summary] + chain[start:] + messages` = `[summary] + new
        # chain[start:]`; the compaction kept it from `compacted_upto` on, past any summary.
        start = ref.start + compacted_upto - (1 if ref.summary else 0)
        after = ref.model_copy(
            update={"head": digest, "start": start, "summary": digest, "transcript": digest}
        )
    elif appended:
        after = ref.model_copy(update={"head": digest, "transcript": digest})
    else:
        after = ref.model_copy(update={"transcript": digest})
    return after, segment


def stores(info: Any) -> bool:
    """Whether a model being dumped for a payload may write references (pydantic's
    ``SerializationInfo``): the payload converter of a converter that stores segments."""
    context = info.context if info is not None else None
    return isinstance(context, dict) and bool(context.get(STORE_CONTEXT))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
