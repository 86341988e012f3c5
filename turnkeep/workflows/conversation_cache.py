"""Conversations a worker process has already validated, by the reference that names them.

A session's turn receives its history by reference (``ConversationRef``): the data converter
expands it into the whole conversation, which the turn would validate message by message and
then dump again, message by message, for its first model call's digest. The session's next
turn on the same worker receives what is, message for message, the conversation the last turn
ended with: the reference after a turn names its history plus its messages (segment digests
bind the content). So a turn that ends leaves its conversation here, as the message objects
it holds and their JSON, under the reference it hands back; the next turn (or a replay of
this one) takes them instead of validating the payload's copy, and dumps only what is new.
A session does the same with its transcript when it continues as new: its next run, on the
same worker, takes the transcript the last one ended with.

Sound because a reference names one content only (its digests) and messages are never
changed in place (``TurnState`` replaces one instead): what comes from here equals what
validation would build, so a replay is the same whether it finds an entry or not.
``turnkeep.workflows`` passes through the sandbox, so this is one table per process; workflow
tasks run on several threads, guarded by a lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from turnkeep.contract.conversation import ConversationRef
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import JsonEntry, JsonRun

# What the table holds at most, by the characters of its entries' JSON (entries of one
# session share their messages, so this over-counts), and how many entries of each kind per
# session: the conversation the last turn ended with, and the one a replay of it would ask for.
MAX_CHARS = 64 * 1024 * 1024
PER_OWNER = 2

Kind = Literal["history", "transcript"]
Key = tuple[str, Kind, str | None, int, str | None]


@dataclass(frozen=True)
class Conversation:
    messages: tuple[Message, ...]
    # (message, sha256, JSON) by message id, for ``MessageJson``: the messages whose JSON the
    # turn had worked out (those of its last model call).
    json: dict[int, JsonEntry]
    chars: int
    # The JSON of the last model call's request, whose messages begin these (or these begin
    # its): the next turn's first call goes through only the messages after them.
    run: JsonRun | None = None


class ConversationCache:
    def __init__(self, max_chars: int = MAX_CHARS) -> None:
        self._max_chars = max_chars
        self._entries: OrderedDict[Key, Conversation] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, ref: ConversationRef, kind: Kind = "history") -> Conversation | None:
        """The history ``ref`` names, or its transcript, if this process holds it."""
        key = _key(ref, kind)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(
        self,
        ref: ConversationRef,
        messages: Sequence[Message],
        json: dict[int, JsonEntry] | None = None,
        kind: Kind = "history",
        *,
        extends: Conversation | None = None,
        run: JsonRun | None = None,
    ) -> Conversation:
        """Keep ``messages``, the history ``ref`` names (or its transcript), and the JSON
        worked out for them (``json``, by message id: entries of other messages do no harm;
        ``run``: a request's, whose messages begin these or are begun by them). ``extends``: an
        entry whose messages begin ``messages``, so only the others are measured."""
        known = json or {}
        start = len(extends.messages) if extends is not None else 0
        chars = (extends.chars if extends is not None else 0) + sum(
            len(known[id(m)][2]) if id(m) in known else _chars(m) for m in messages[start:]
        )
        entry = Conversation(tuple(messages), known, chars, run)
        key = _key(ref, kind)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._chars -= old.chars
            self._entries[key] = entry
            self._chars += chars
            same = [k for k in self._entries if k[:2] == key[:2]]
            for stale in same[:-PER_OWNER]:
                self._chars -= self._entries.pop(stale).chars
            while self._chars > self._max_chars and len(self._entries) > 1:
                _, dropped = self._entries.popitem(last=False)
                self._chars -= dropped.chars
        return entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)


def _chars(message: Message) -> int:
    """Roughly what a message's JSON would take, without dumping it: its texts, plus a little
    for the rest."""
    results = (message.tool_results or {}).values()
    texts = [*message.content, *(block for result in results for block in result.content)]
    return 200 + sum(len(getattr(block, "text", "") or "") for block in texts)


def _key(ref: ConversationRef, kind: Kind) -> Key:
    if kind == "transcript":
        return (ref.owner, kind, ref.transcript, 0, None)
    return (ref.owner, kind, ref.head, ref.start, ref.summary)


conversations = ConversationCache()
