"""Stored conversations: where a session's turns keep their messages, and the codec that stores
and expands them (``turnkeep.contract.conversation`` says why and what a segment is).

Workflow code marks what it hands over by reference; this module does the I/O, in the data
converter's codec, outside the workflow:

- **encode**: a segment that still carries its messages is written to the store under its
  digest (checked; through the inner codec, so encryption covers it) and its messages are left
  out of the payload;
- **decode**: after the inner codec, a segment gets its messages back, a history reference
  becomes the history's messages and a transcript reference the transcript's; only where
  turnkeep writes one, under the owner the reference beside it names (``_check_references``),
  so that no client can have another session's messages expanded into its own payload.

A payload without a marker is passed through untouched (one substring check). Segments are
immutable and named by their digest, so a worker keeps the ones it has read or written, and
the expansions of the chains it has walked, in memory: the consecutive turns of one session
read each segment once.

The store sits beside payload storage: with the ``local`` driver, a directory per session under
``conversations/`` of the payload directory (``turnkeep.payloads.storage.sweep`` deletes a
session's segments once it is closed and nobody has read or written them for the retention);
with ``s3``, keys under ``conversations/`` of the bucket and prefix (a bucket lifecycle rule
expires them, as it does stored payloads: make it longer than your sessions last).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.converter import ExternalStorage, PayloadCodec

from turnkeep.contract.conversation import (
    EXPANDABLE,
    EXPANDED_METADATA,
    MARKER,
    ConversationRef,
    segment_digest,
)
from turnkeep.contract.messages import Message, message_json
from turnkeep.contract.turn_io import TurnResult
from turnkeep.payloads.storage.errors import MissingPayloadError, PayloadStorageError
from turnkeep.payloads.storage.local import SHA256, LocalDirectoryDriver, write_durably
from turnkeep.payloads.storage.owners import owner_key
from turnkeep.payloads.storage.s3 import S3Driver
from turnkeep.payloads.storage.sweep import BASES

JSON = b"json/plain"
SEGMENT = b"binary/turnkeep-segment"
_EXPANDED = EXPANDED_METADATA
_MARKER_BYTES = f'"{MARKER}"'.encode()
DIRECTORY = "conversations"
# What a worker keeps of the segments it has read or written, by their messages' JSON size.
CACHE_BYTES = 64 * 1024 * 1024
# Where a payload may hold a reference, and what names its owner beside it (``_check_references``).
_PLACES = frozenset({"messages", "history", "transcript"})
_ANCHORS = ("history_ref", "conversation")
# Expansions of chains kept, each a tuple of references to the cached messages' JSON.
CHAINS = 64


@dataclass(frozen=True)
class ConversationPrefix:
    """The first messages of a stored transcript (``ConversationCodec.prefix``), as their JSON,
    and the longest run of whole segments among them a fork can go on from by reference:
    ``shared``, the last of them (its session and digest), which holds ``shared_count``."""

    texts: tuple[str, ...]
    shared: tuple[str, str] | None
    shared_count: int

    def last(self) -> Message | None:
        return Message.model_validate_json(self.texts[-1]) if self.texts else None


async def with_history(codec: PayloadCodec | None, result: TurnResult) -> TurnResult:
    """``result`` with its ``history`` read from the store when the turn handed it back by
    reference (a session's turn): what a client reading the turn expects."""
    if result.conversation is None or result.history or not isinstance(codec, ConversationCodec):
        return result
    return result.model_copy(update={"history": await codec.history(result.conversation)})


class MissingSegmentError(MissingPayloadError):
    """A stored conversation refers to a segment that is not in the store."""


@dataclass(frozen=True)
class _Segment:
    parent: str | None
    prev: str | None
    messages: tuple[str, ...]
    summary: str | None
    # A fork's first segment: the session and segment whose chain it goes on from (both its
    # history and its transcript), shared by reference rather than copied (``fork_prefix``).
    base: tuple[str, str] | None = None

    @property
    def digest(self) -> str:
        return segment_digest(self.parent, self.prev, self.messages, self.summary, self.base)

    @property
    def size(self) -> int:
        return sum(len(text) for text in self.messages) + len(self.summary or "")


class ConversationStore(ABC):
    """Segment bytes by session and digest. Writing one twice is harmless (same content)."""

    location: str

    @abstractmethod
    async def put(self, owner: str, digest: str, data: bytes) -> None: ...

    @abstractmethod
    async def get(self, owner: str, digest: str) -> bytes:
        """The segment's bytes; ``MissingSegmentError`` when it is not there."""

    async def note_base(self, owner: str, base: str) -> None:
        """Record that ``owner``'s conversation goes on from ``base``'s (a fork), for a
        garbage collector that must keep ``base``'s segments while ``owner`` runs. Nothing by
        default: a bucket's lifecycle rule expires objects by age alone."""
        del owner, base


class LocalConversationStore(ConversationStore):
    """A file per segment, in a directory per session: written under a temporary name and
    renamed into place (a reader never sees half a file); reading refreshes its mtime."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.location = f"local directory {directory}"

    def _path(self, owner: str, digest: str) -> Path:
        if not SHA256.fullmatch(digest):
            # Digests come from payloads any client may send: never a path of their own.
            raise PayloadStorageError(f"not a segment digest: {digest!r}")
        return self.directory / owner_key(owner) / digest

    async def put(self, owner: str, digest: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, self._path(owner, digest), data)

    async def get(self, owner: str, digest: str) -> bytes:
        return await asyncio.to_thread(self._read, self._path(owner, digest))

    async def note_base(self, owner: str, base: str) -> None:
        await asyncio.to_thread(self._note, owner_key(owner), owner_key(base))

    def _note(self, owner: str, base: str) -> None:
        path = self.directory / owner / BASES
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as file:  # one line per base; a fork has one
            file.write(base + "\n")

    def _write(self, path: Path, data: bytes) -> None:
        if path.exists():
            with contextlib.suppress(OSError):
                os.utime(path)
            return
        write_durably(path, data, what="conversations", where="payload_storage.path")

    def _read(self, path: Path) -> bytes:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise MissingSegmentError(
                f"a stored conversation refers to segment {path.name}, which is not in "
                f"{path.parent} (removed by a sweep, or another payload_storage.path)"
            ) from None
        with contextlib.suppress(OSError):
            os.utime(path)  # in use: keep it from the sweep
        return data


class S3ConversationStore(ConversationStore):
    """Objects under ``conversations/<session>/<digest>`` of payload storage's bucket."""

    def __init__(self, driver: S3Driver) -> None:
        self._client = driver.objects
        self._bucket = driver.bucket
        self.location = f"{driver.location} ({DIRECTORY}/)"

    def _key(self, owner: str, digest: str) -> str:
        if not SHA256.fullmatch(digest):
            raise PayloadStorageError(f"not a segment digest: {digest!r}")
        return f"{DIRECTORY}/{owner_key(owner)}/{digest}"

    async def put(self, owner: str, digest: str, data: bytes) -> None:
        key = self._key(owner, digest)
        if not await self._client.object_exists(bucket=self._bucket, key=key):
            await self._client.put_object(bucket=self._bucket, key=key, data=data)

    async def get(self, owner: str, digest: str) -> bytes:
        key = self._key(owner, digest)
        try:
            return await self._client.get_object(bucket=self._bucket, key=key)
        except Exception as err:
            raise MissingSegmentError(
                f"a stored conversation refers to segment {digest}, which cannot be read from "
                f"{self.location}: {type(err).__name__}"
            ) from None


def conversation_store(storage: ExternalStorage | None) -> ConversationStore | None:
    """The store beside ``storage``'s first driver that turnkeep built (local or S3); None
    without one (payload storage off, or a driver of the application's own): sessions then
    hand their turns the conversation itself."""
    for driver in storage.drivers if storage is not None else ():
        if isinstance(driver, LocalDirectoryDriver):
            return LocalConversationStore(driver.directory / DIRECTORY)
        if isinstance(driver, S3Driver):
            return S3ConversationStore(driver)
    return None


class ConversationCodec(PayloadCodec):
    """Stores the segments a payload carries and expands the references it holds, around
    ``inner`` (turnkeep's encryption, an application's codec, or none)."""

    def __init__(self, store: ConversationStore, inner: PayloadCodec | None) -> None:
        self.store = store
        self.inner = inner
        self._segments: OrderedDict[tuple[str, str], _Segment] = OrderedDict()
        self._cached_bytes = 0
        self._chains: OrderedDict[tuple[str, str, str], tuple[str, ...]] = OrderedDict()

    # -- encoding ------------------------------------------------------------------------------

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = list(payloads)
        for i, payload in enumerate(out):
            if _marked(payload):
                out[i] = await self._store_segments(payload)
        return await self.inner.encode(out) if self.inner is not None else out

    async def _store_segments(self, payload: Payload) -> Payload:
        document = json.loads(payload.data)
        stored = False
        for marker in _markers(document):
            if marker[MARKER] == "segment" and "messages" in marker:
                await self._store(marker)
                # Reading it back takes only its owner and digest (and ``follows``): what
                # the digest covers is in the store.
                for name in ("messages", "summary", "parent", "prev"):
                    marker.pop(name, None)
                stored = True
        if not stored:
            return payload
        return Payload(metadata=payload.metadata, data=_dumps(document).encode())

    async def _store(self, marker: dict[str, Any]) -> None:
        owner, digest = str(marker["owner"]), str(marker["digest"])
        messages = tuple(str(m) for m in marker["messages"])
        segment = _Segment(
            marker.get("parent"), marker.get("prev"), messages, marker.get("summary")
        )
        if segment.digest != digest:
            raise PayloadStorageError(f"segment {digest} does not match its messages")
        await self._put(owner, segment)

    async def _put(self, owner: str, segment: _Segment) -> None:
        digest = segment.digest
        if (owner, digest) in self._segments:
            return  # written by this process already
        data = Payload(metadata={"encoding": SEGMENT}, data=_segment_bytes(segment))
        if self.inner is not None:
            [data] = await self.inner.encode([data])
        await self.store.put(owner, digest, data.SerializeToString())
        self._keep(owner, digest, segment)

    # -- decoding ------------------------------------------------------------------------------

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = await self.inner.decode(payloads) if self.inner is not None else list(payloads)
        for i, payload in enumerate(out):
            if _EXPANDED in payload.metadata:  # only this codec says what it expanded
                out[i] = payload = Payload(metadata=payload.metadata, data=payload.data)
                del payload.metadata[_EXPANDED]
            if _marked(payload):
                out[i] = await self._expand(payload)
        return out

    async def _expand(self, payload: Payload) -> Payload:
        """``payload`` with its references replaced by their messages' JSON as stored; where
        a history or transcript reference sat under a top-level key, the metadata says where
        its JSON is (a worker that holds the conversation then skips parsing it:
        ``conversation.Messages``)."""
        document = json.loads(payload.data)
        _check_references(document)
        fragments: list[str] = []
        top_level: dict[int, str] = {}  # fragment number -> the top-level key it is under

        async def expanded(marker: dict[str, Any], key: str | None) -> str:
            kind, owner = marker[MARKER], str(marker.get("owner", ""))
            if kind == "segment":
                segment = await self._segment(owner, str(marker["digest"]))
                texts = segment.messages
                if marker.get("follows") is True:  # a turn's input, stored by its session
                    if segment.prev is None:
                        raise PayloadStorageError(f"segment {segment.digest} follows none")
                    texts = (await self._segment(owner, segment.prev)).messages + texts
            elif kind == "history":
                chain = await self._chain(owner, marker.get("head"), "parent")
                summary = await self._summary(owner, marker.get("summary"))
                texts = summary + chain[int(marker.get("start") or 0) :]
            elif kind == "transcript":
                texts = await self._chain(owner, marker.get("head"), "prev")
            else:
                raise PayloadStorageError(f"unknown conversation reference {kind!r}")
            if key in EXPANDABLE and kind != "segment":  # a conversation, not a turn's part
                top_level[len(fragments)] = key
            fragments.append(f"[{','.join(texts)}]")
            return f"\x00{token}{len(fragments) - 1}\x00"

        # Placeholders no message can hold by chance, swapped for the messages' JSON as is
        # (they appear in the text in the order they were made).
        token = os.urandom(8).hex()
        text = _dumps(await _replace_markers(document, expanded))
        data, at, spans = bytearray(), 0, {}
        for n, fragment in enumerate(fragments):
            placeholder = json.dumps(f"\x00{token}{n}\x00")
            found = text.index(placeholder, at)
            data += text[at:found].encode()
            start = len(data)
            data += fragment.encode()
            if n in top_level:
                spans[top_level[n]] = [start, len(data)]
            at = found + len(placeholder)
        data += text[at:].encode()
        out = Payload(metadata=payload.metadata, data=bytes(data))
        if spans:
            out.metadata[_EXPANDED] = _dumps(spans).encode()
        return out

    # -- forks -------------------------------------------------------------------------------

    async def prefix(
        self, ref: ConversationRef, count: int, *, history: bool = False
    ) -> ConversationPrefix:
        """The first ``count`` messages of the transcript ``ref`` names (of its history, when
        ``history``: after a rewind the two part ways), fewer if it has fewer, and which of its
        segments a fork of them can share. A segment is shared only if every one before it,
        and itself, extends the history as it extends the transcript (no compaction, no turn
        without history, no rewind): the history of a fork that goes on from it is then
        exactly those messages."""
        if history and (ref.summary is not None or ref.start):
            # A compacted history is not a chain's messages from its start: nothing to share.
            chain = await self._chain(ref.owner, ref.head, "parent")
            compacted = (await self._summary(ref.owner, ref.summary)) + chain[ref.start :]
            return ConversationPrefix(compacted[:count], None, 0)
        segments: list[_Segment] = []
        places: list[tuple[str, str]] = []
        owner, digest = ref.owner, ref.head if history else ref.transcript
        while digest is not None:
            segment = await self._segment(owner, digest)
            segments.append(segment)
            places.append((owner, digest))
            digest = segment.parent if history else segment.prev
            if digest is None and segment.base is not None:
                owner, digest = segment.base
        segments.reverse()
        places.reverse()
        texts: list[str] = []
        shared, shared_count, sharing = None, 0, True
        for segment, place in zip(segments, places, strict=True):
            if len(texts) + len(segment.messages) > count:
                texts += segment.messages[: count - len(texts)]
                break
            texts += segment.messages
            sharing = sharing and segment.parent == segment.prev and segment.summary is None
            if sharing:
                shared, shared_count = place, len(texts)
        return ConversationPrefix(tuple(texts), shared, shared_count)

    async def store_fork(
        self, prefix: ConversationPrefix, owner: str, tail: Sequence[Message] = ()
    ) -> ConversationRef:
        """The conversation of session ``owner`` (a fork) made of ``prefix`` then ``tail``: one
        new segment, holding the messages after the shared ones, on from them by reference.
        What it stores is the size of that segment, whatever the source's length."""
        texts = (*prefix.texts[prefix.shared_count :], *(message_json(m) for m in tail))
        segment = _Segment(None, None, texts, None, prefix.shared)
        await self._put(owner, segment)
        if prefix.shared is not None and prefix.shared[0] != owner:
            await self.store.note_base(owner, prefix.shared[0])
        return ConversationRef(owner=owner, head=segment.digest, transcript=segment.digest)

    async def history(self, ref: ConversationRef) -> list[Message]:
        """The history ``ref`` names, as messages (a client reading a session's turn, whose
        result hands its history back by reference)."""
        chain = await self._chain(ref.owner, ref.head, "parent")
        texts = await self._summary(ref.owner, ref.summary) + chain[ref.start :]
        return [Message.model_validate_json(text) for text in texts]

    async def _summary(self, owner: str, digest: str | None) -> tuple[str, ...]:
        """The summary message the segment ``digest`` holds, as the history's first message."""
        if digest is None:
            return ()
        summary = (await self._segment(owner, digest)).summary
        if summary is None:
            raise PayloadStorageError(f"stored conversation segment {digest} holds no summary")
        return (summary,)

    async def _chain(self, owner: str, head: str | None, pointer: str) -> tuple[str, ...]:
        """Every message of the chain ending at ``head``, oldest first, following ``pointer``
        (``parent``: the history; ``prev``: the transcript)."""
        if head is None:
            return ()
        walked: list[_Segment] = []
        base: tuple[str, ...] = ()
        digest: str | None = head
        at = owner  # whose segments: a fork's chain goes on in its source's
        while digest is not None:
            cached = self._chains.get((at, digest, pointer))
            if cached is not None:
                self._chains.move_to_end((at, digest, pointer))
                base = cached
                break
            segment = await self._segment(at, digest)
            walked.append(segment)
            digest = segment.parent if pointer == "parent" else segment.prev
            if digest is None and segment.base is not None:
                at, digest = segment.base
        chain = base + tuple(text for segment in reversed(walked) for text in segment.messages)
        self._chains[(owner, head, pointer)] = chain
        while len(self._chains) > CHAINS:
            self._chains.popitem(last=False)
        return chain

    async def _segment(self, owner: str, digest: str) -> _Segment:
        cached = self._segments.get((owner, digest))
        if cached is not None:
            self._segments.move_to_end((owner, digest))
            return cached
        stored = Payload()
        stored.ParseFromString(await self.store.get(owner, digest))
        if self.inner is not None:
            [stored] = await self.inner.decode([stored])
        segment = _read_segment(stored)
        if segment.digest != digest:
            raise PayloadStorageError(
                f"stored conversation segment {digest} is damaged: its contents no longer "
                "match their digest"
            )
        self._keep(owner, digest, segment)
        return segment

    def _keep(self, owner: str, digest: str, segment: _Segment) -> None:
        self._segments[(owner, digest)] = segment
        self._cached_bytes += segment.size
        while self._cached_bytes > CACHE_BYTES and len(self._segments) > 1:
            _, dropped = self._segments.popitem(last=False)
            self._cached_bytes -= dropped.size


def _segment_bytes(segment: _Segment) -> bytes:
    """A segment as stored: a line of JSON with its pointers (``prev`` only where it is not
    ``parent``) and summary, then each message's JSON on a line of its own, as is. Inside a
    JSON list they would be strings, every quote in them escaped."""
    if any("\n" in text for text in segment.messages):
        # JSON as a model writes it has none; a text that does is not a message.
        raise PayloadStorageError("a segment's message holds a line break: not a message's JSON")
    header: dict[str, Any] = {"parent": segment.parent}
    if segment.prev != segment.parent:
        header["prev"] = segment.prev
    if segment.summary is not None:
        header["summary"] = segment.summary
    if segment.base is not None:
        header["base"] = list(segment.base)
    return "\n".join([_dumps(header), *segment.messages]).encode()


def _read_segment(stored: Payload) -> _Segment:
    if stored.metadata.get("encoding") != SEGMENT:
        raise PayloadStorageError("a stored conversation segment is not in the segment format")
    header, *texts = stored.data.decode().split("\n")
    body = json.loads(header)
    prev = body["prev"] if "prev" in body else body.get("parent")
    base = body.get("base")
    return _Segment(
        body.get("parent"),
        prev,
        tuple(texts),
        body.get("summary"),
        (str(base[0]), str(base[1])) if isinstance(base, list) and len(base) == 2 else None,
    )


def _marked(payload: Payload) -> bool:
    if payload.metadata.get("encoding") != JSON:
        return False
    if _MARKER_BYTES in payload.data:
        return True
    # The key written with a JSON escape is the same key to any parser: a client's payload
    # must not carry one past this check, to be expanded where the worker passes it on.
    if b"\\u" not in payload.data:
        return False
    try:
        return bool(_markers(json.loads(payload.data)))
    except ValueError:
        return False  # not JSON: the payload converter says so


def _check_references(document: Any) -> None:
    """Refuse a payload whose references could name a conversation its receiver does not own.

    Turnkeep writes a reference only as the value of a top-level ``messages``, ``history`` or
    ``transcript``, and only beside the reference that names whose conversation it is:
    ``history_ref`` (a turn's input, which ``TurnWorkflow`` honours only from the session that
    owns it) or ``conversation`` (a turn's result, a session's state, which only the session's
    own turns and runs write). Any client may send a payload, and digests are no secret: a
    reference anywhere else, or under another owner than that, would have another session's
    messages expanded into it before any workflow code could check it."""
    if not isinstance(document, dict):
        if _markers(document):
            raise PayloadStorageError(
                "a conversation reference is allowed only in a turn's or a session's "
                "`messages`, `history` or `transcript`"
            )
        return
    anchors = {
        name: document[name].get("owner")
        for name in _ANCHORS
        if isinstance(document.get(name), dict)
    }
    for key, value in document.items():
        if key in _PLACES and isinstance(value, dict) and isinstance(value.get(MARKER), str):
            if "ref" in value and value["ref"] != "history_ref":
                raise PayloadStorageError(
                    f"the conversation reference in `{key}` may name only `history_ref`"
                )
            _check_owner(key, _with_ref(value, document).get("owner"), anchors)
        elif _markers(value):
            raise PayloadStorageError(
                f"`{key}` holds a conversation reference inside it: one is allowed only as a "
                "turn's or a session's whole `messages`, `history` or `transcript`"
            )


def _check_owner(key: str, owner: Any, anchors: dict[str, Any]) -> None:
    if not anchors:
        raise PayloadStorageError(
            f"`{key}` holds a conversation reference without a `history_ref` beside it: only "
            "a session hands a turn a stored conversation, as its child"
        )
    for name, anchor in anchors.items():
        if not isinstance(anchor, str) or not anchor or owner != anchor:
            raise PayloadStorageError(
                f"the conversation reference in `{key}` names another conversation than "
                f"`{name}` does: a stored conversation is handed only by the session that owns "
                "it, to its own turns"
            )


def _markers(node: Any) -> list[dict[str, Any]]:
    """The marker objects in a JSON document, outermost first."""
    found: list[dict[str, Any]] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get(MARKER), str):
                found.append(item)
                continue
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


async def _replace_markers(node: Any, replace: Any, *, root: bool = True) -> Any:
    """``node`` with each marker replaced by ``replace(marker, key)``: ``key`` is the top-level
    key the marker is the value of, None for a marker deeper down."""
    if isinstance(node, dict) and not isinstance(node.get(MARKER), str):
        replaced = {}
        for name, value in node.items():
            value = _with_ref(value, node)
            if root and isinstance(value, dict) and isinstance(value.get(MARKER), str):
                replaced[name] = await replace(value, name)
            else:
                replaced[name] = await _replace_markers(value, replace, root=False)
        return replaced
    if isinstance(node, dict):
        return await replace(node, None)
    if isinstance(node, list):
        return [await _replace_markers(item, replace, root=False) for item in node]
    return node


def _with_ref(value: Any, siblings: dict[str, Any]) -> Any:
    """A marker that names the reference beside it (``{"$turnkeep": "history", "ref": key}``)
    with that reference's fields."""
    if isinstance(value, dict) and isinstance(value.get(MARKER), str) and "ref" in value:
        ref = siblings.get(str(value["ref"]))
        if not isinstance(ref, dict):
            raise PayloadStorageError(f"a conversation reference names {value['ref']!r}, absent")
        return {**ref, MARKER: value[MARKER]}
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
