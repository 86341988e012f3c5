"""turnkeep's payload converter: Temporal's pydantic converter, built once per process.

The SDK builds a new payload converter every time it derives a data converter for a context,
which it does for every workflow activation and every activity task. Temporal's
``PydanticPayloadConverter`` makes a fresh JSON converter each time, and with it an empty cache
of pydantic ``TypeAdapter``s, so every activity rebuilt the adapters for its input and result
types (about a twentieth of a busy worker's time on a quick turn, in ``bench``'s profile). This
class shares one JSON converter, and so one adapter cache, across all of them. The converter
holds no per-call state and ``functools.lru_cache`` is thread-safe, so workflow threads and the
activity event loop can share it. The types it caches are the passthrough
``turnkeep.workflows`` modules' (``turnkeep.worker.runner``), the same objects in
and out of the sandbox, so the cache does not grow with each workflow run.

``TurnkeepDataConverter`` keeps a payload that a client sent to a workflow, and that cannot be
decoded, from failing the workflow's task for ever (see its docstring).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from contextvars import ContextVar
from typing import Any, ClassVar

import pydantic_core
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DefaultPayloadConverter,
    EncodingPayloadConverter,
    JSONPlainPayloadConverter,
)
from temporalio.exceptions import ApplicationError

from turnkeep.contract.conversation import EXPANDABLE, EXPANDED_METADATA, STORE_CONTEXT
from turnkeep.contract.messages import Message, message_json
from turnkeep.payloads.codec import ENCODING as ENCRYPTED
from turnkeep.payloads.codec import EncryptedPayloadRefusal, refuse_encrypted
from turnkeep.payloads.conversations import ConversationCodec
from turnkeep.support.sdk_private import DecodeStage, DecodingStages, decoding_outside_commands

UNDECODABLE = b"binary/turnkeep-undecodable"
ERROR_TYPE = "turnkeep-error-type"


class UndecodablePayloadError(ApplicationError):
    """A payload sent to a workflow could not be decoded (its key is unknown, it does not
    authenticate, it is not encrypted, its stored payload is missing...). Non-retryable: what
    it was sent for fails (the workflow's start, an update, a query) with this message."""

    def __init__(self, message: str, error_type: str | None) -> None:
        super().__init__(message, type=error_type, non_retryable=True)


class _UndecodableConverter(EncodingPayloadConverter):
    """Raises ``UndecodablePayloadError`` for the stand-in ``TurnkeepDataConverter`` puts where
    a payload could not be decoded; never writes one."""

    @property
    def encoding(self) -> str:
        return UNDECODABLE.decode()

    def to_payload(self, value: Any) -> Payload | None:
        return None

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        error_type = payload.metadata.get(ERROR_TYPE, b"").decode("utf-8", errors="replace")
        raise UndecodablePayloadError(
            payload.data.decode("utf-8", errors="replace"), error_type or None
        )


class _JSONConverter(PydanticJSONPlainPayloadConverter):
    """Temporal's pydantic JSON converter, parsing a payload read without a type (a workflow's
    start input, an update's arguments: turnkeep takes those as they come and checks them
    itself) with pydantic-core's JSON parser alone, at half the cost of validating it as
    ``Any``. A turn's input holds the whole conversation, and its first workflow task parses
    it on the worker that is starting the turn for a session at that moment."""

    def __init__(self, *, stores_conversations: bool) -> None:
        super().__init__()
        # Tells the models that can (a session's turn result, a session's state) whether to
        # write a stored conversation by reference: only where the codec stores segments.
        self._context = {STORE_CONTEXT: stores_conversations}

    def to_payload(self, value: Any) -> Payload | None:
        if isinstance(value, Message):  # a model call's answer, in every turn's history
            data = message_json(value).encode()
        else:
            data = pydantic_core.to_json(value, context=self._context)
        return Payload(metadata={"encoding": self.encoding.encode()}, data=data)

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        if type_hint is None:
            try:
                return _untyped(payload)
            except ValueError:
                pass  # not JSON: the adapter's ValidationError says why, as without this
        return super().from_payload(payload, type_hint)


def _untyped(payload: Payload) -> Any:
    """A payload's JSON, parsed but for the conversations the codec expanded under its
    top-level keys, which stay the bytes of their JSON (``conversation.Messages``): a session's
    turn on a worker that holds its history already never needs them parsed, and one that does
    not parses them as it validates its input."""
    spans = _spans(payload.metadata.get(EXPANDED_METADATA))
    if not spans:
        return pydantic_core.from_json(payload.data)
    data, parts, expanded, at = payload.data, [], {}, 0
    for key, (start, end) in sorted(spans.items(), key=lambda item: item[1][0]):
        if not at <= start <= end <= len(data):
            return pydantic_core.from_json(data)
        parts += [data[at:start], b"null"]
        expanded[key] = data[start:end]
        at = end
    value = pydantic_core.from_json(b"".join([*parts, data[at:]]))
    if not isinstance(value, dict) or any(value.get(key, 0) is not None for key in expanded):
        return pydantic_core.from_json(data)  # the spans were not where the codec put them
    return {**value, **expanded}


def _spans(metadata: bytes | None) -> dict[str, tuple[int, int]]:
    if not metadata:
        return {}
    try:
        spans = json.loads(metadata)
    except ValueError:
        return {}
    if not isinstance(spans, dict):
        return {}
    return {
        key: (span[0], span[1])
        for key, span in spans.items()
        if key in EXPANDABLE
        and isinstance(span, list)
        and len(span) == 2
        and all(type(n) is int for n in span)
    }


_REFUSE_ENCRYPTED = EncryptedPayloadRefusal()


def _converters(json_converter: _JSONConverter) -> dict[bytes, EncodingPayloadConverter]:
    """Temporal's defaults with ``json_converter``, by encoding."""
    return {
        c.encoding.encode(): c
        for c in (
            *(
                json_converter if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            ),
            _REFUSE_ENCRYPTED,
            _UndecodableConverter(),
        )
    }


# Built once: the SDK constructs a payload converter for every payload it converts (a
# ``dataclasses.replace`` of the data converter re-runs its ``__post_init__``), ~15 times per
# turn iteration with payload storage on.
_JSON = _JSONConverter(stores_conversations=False)
_STORING_JSON = _JSONConverter(stores_conversations=True)
_CONVERTERS = _converters(_JSON)
_STORING_CONVERTERS = _converters(_STORING_JSON)


class TurnkeepPayloadConverter(CompositePayloadConverter):
    """``temporalio.contrib.pydantic.PydanticPayloadConverter`` with a shared JSON converter,
    and one that names the missing ``encryption`` config when it meets an encrypted payload
    (with encryption on, the codec decrypts every payload before this converter sees it)."""

    # The encodings it reads: what the data converter lets reach it (a subclass reading more
    # says so here).
    encodings: ClassVar[Collection[bytes]] = _CONVERTERS.keys()

    def __init__(self) -> None:
        # Shared, not copied: nothing mutates the mapping (``with_context`` gives a new
        # instance its own), and building it was most of this constructor's cost.
        self.converters = _CONVERTERS


class StoringPayloadConverter(TurnkeepPayloadConverter):
    """The same, for a data converter whose codec stores conversations: a session's turns and
    state are written with their conversation by reference."""

    def __init__(self) -> None:
        self.converters = _STORING_CONVERTERS


# Set while ``decode``/``decode_failure`` run: their callers (clients, activities, `turnkeep
# show`) get the decoding error itself, raised where it happens.
_RAISE_AT_ONCE: ContextVar[bool] = ContextVar("turnkeep_raise_at_once", default=False)


class TurnkeepDataConverter(DecodingStages):
    """Temporal's data converter, except for payloads a client sent to a workflow that cannot
    be decoded.

    The worker decodes a workflow activation's payloads (codec, external storage) before any
    workflow code runs, and any error there fails the workflow task, which is retried for ever;
    a non-retryable ``ApplicationError`` there would instead fail the whole workflow, so one bad
    update or query from any client could kill a healthy turn. So where such a payload cannot
    be decoded, this puts a stand-in that says why, and the payload converter raises
    ``UndecodablePayloadError`` when the workflow converts it: inside the workflow, where the
    SDK fails only what the payload was sent for. A bad start input fails the workflow, an
    update is rejected, a query fails, a signal is dropped (logged).

    Only payloads that come from clients get a stand-in: those the activation's jobs carry
    outside any workflow command (start input, updates, queries, signals). A command's payload
    (an activity's result) comes from turnkeep's own workers, and a failure to decode it is a
    worker's misconfiguration that fixing it mends: it still fails the task, which retries.
    So do I/O errors (the storage may come back). On a replay, the stand-in fails the workflow
    differently from its history, a nondeterminism error that also retries the task.
    """

    async def decode(
        self, payloads: Sequence[Payload], type_hints: list[type] | None = None
    ) -> list[Any]:
        token = _RAISE_AT_ONCE.set(True)
        try:
            return await super().decode(payloads, type_hints)
        finally:
            _RAISE_AT_ONCE.reset(token)

    async def decode_failure(self, failure: Failure) -> BaseException:
        token = _RAISE_AT_ONCE.set(True)
        try:
            return await super().decode_failure(failure)
        finally:
            _RAISE_AT_ONCE.reset(token)

    async def decode_stage(self, stage: DecodeStage, payloads: Sequence[Payload]) -> list[Payload]:
        """``stage`` applied to ``payloads``, with a stand-in for each client's payload that it
        cannot decode."""
        if _RAISE_AT_ONCE.get() or not decoding_outside_commands():
            return await stage(payloads)
        pending = [i for i, p in enumerate(payloads) if p.metadata.get("encoding") != UNDECODABLE]
        if len(pending) == len(payloads):
            try:
                return await stage(payloads)
            except Exception as err:
                if _transient(err):
                    raise
        # One at a time, to tell the bad payloads from the good ones.
        decoded = list(payloads)
        for i in pending:
            try:
                [decoded[i]] = await stage([payloads[i]])
            except Exception as err:
                if _transient(err):
                    raise
                decoded[i] = _stand_in(err)
        return decoded

    async def codec_decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        codec = self.payload_codec
        if isinstance(codec, ConversationCodec):
            codec = codec.inner
        if codec is None:
            # Here too, not only in the payload converter: a workflow converting it would
            # fail its task with "Failed decoding arguments".
            for payload in payloads:
                if payload.metadata.get("encoding") == ENCRYPTED:
                    refuse_encrypted(payload)
        decoded = await super().codec_decode(payloads)
        # The last stage: what is left must be in an encoding the payload converter reads, or
        # converting it inside the workflow would fail the task for ever, as above.
        converter = self.payload_converter_class
        if issubclass(converter, TurnkeepPayloadConverter):
            known = converter.encodings
            for payload in decoded:
                encoding = payload.metadata.get("encoding")
                if encoding not in known:
                    raise UnknownEncodingError(encoding, known)
        return decoded


class UnknownEncodingError(ValueError):
    """A payload's ``encoding`` metadata names no encoding the payload converter reads."""

    def __init__(self, encoding: bytes | None, known: Collection[bytes]) -> None:
        what = (
            f"its encoding {encoding.decode('utf-8', errors='replace')!r}"
            if encoding is not None
            else "no encoding (its metadata names none)"
        )
        # Not the two turnkeep reads only to refuse: they are no encoding to send in.
        readable = ", ".join(sorted(e.decode() for e in known if e not in (UNDECODABLE, ENCRYPTED)))
        super().__init__(f"the payload has {what}; this worker reads {readable}")


def _transient(err: BaseException) -> bool:
    """Whether an I/O error caused ``err`` (retrying may succeed), not the payload itself."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, OSError):
            return True
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return False


def _stand_in(err: Exception) -> Payload:
    return Payload(
        metadata={"encoding": UNDECODABLE, ERROR_TYPE: type(err).__name__.encode()},
        data=f"a payload sent to this workflow cannot be decoded: {err}".encode(),
    )
