"""How ``TurnkeepPlugin`` joins a Temporal application's own set-up instead of replacing it.

- **Data converter.** turnkeep needs its pydantic payload converter and its payload storage;
  the application keeps its payload codec (its own encryption, say) and failure converter. A
  converter turnkeep already made (``connect``, or the plugin on the client) is kept as it is,
  after checking it has the storage and encryption the worker's settings give.
- **Workflow runner.** The application's sandbox, with ``turnkeep.workflows``, ``turnkeep.contract``
  (and beartype) passed through, so turnkeep's workflow code is imported once per process, not
  per run.
- **Sticky queue.** ``turnkeep.worker.plugin.STICKY_TIMEOUT`` instead of the SDK's default
  (left alone when set).
"""

from __future__ import annotations

import dataclasses

from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    DefaultPayloadConverter,
    ExternalStorage,
    PayloadCodec,
)

from turnkeep.payloads.codec import EncryptionCodec, describe_codec, same_codec
from turnkeep.payloads.conversations import ConversationCodec, conversation_store
from turnkeep.payloads.converter import (
    StoringPayloadConverter,
    TurnkeepDataConverter,
    TurnkeepPayloadConverter,
)
from turnkeep.payloads.storage import describe_storage, same_storage

# Payload converters whose payloads turnkeep's reads and writes alike: Temporal's JSON, and
# pydantic's (which turnkeep's is).
_COMPATIBLE_CONVERTERS = (DefaultPayloadConverter, PydanticPayloadConverter)


def data_converter(
    storage: ExternalStorage | None, codec: PayloadCodec | None = None
) -> DataConverter:
    """turnkeep's data converter on its own: pydantic JSON payloads, large ones in ``storage``,
    all of them through ``codec`` (encryption) when there is one.

    The SDK runs the codec before external storage, so what is stored is encoded too. With a
    codec, failures' messages and stack traces go into an encoded payload as well (Temporal's
    encoded failure attributes): an error can quote a prompt or a tool's output."""
    return turnkeep_converter(None, storage, codec)


def turnkeep_converter(
    existing: DataConverter | None,
    storage: ExternalStorage | None,
    codec: PayloadCodec | None,
) -> DataConverter:
    """``existing`` (an application's converter, or none) with turnkeep's payload converter and
    ``storage``, and encrypted by ``codec`` (turnkeep's ``encryption``) unless it has a codec of
    its own: both is refused, since neither turnkeep's codec server nor the application's would
    read the other's layer."""
    if isinstance(existing, TurnkeepDataConverter):
        _check_storage(existing.external_storage, storage)
        # A client encrypting with keys the settings lack is a mismatch too; a codec of the
        # application's own is not turnkeep's business.
        theirs = inner_codec(existing.payload_codec)
        if codec is not None or isinstance(theirs, EncryptionCodec):
            _check_codec(theirs, codec)
        return existing
    base = existing or DataConverter.default
    if not issubclass(base.payload_converter_class, _COMPATIBLE_CONVERTERS):
        raise ValueError(
            f"the client's payload converter is {base.payload_converter_class.__name__}; turnkeep "
            "needs its own (pydantic JSON, a superset of Temporal's default) for every payload "
            "on the worker. Keep a custom converter for workers of your own, or build it on "
            "temporalio.contrib.pydantic.PydanticPayloadConverter."
        )
    if base.payload_codec is not None and codec is not None:
        raise ValueError(
            f"the client has {describe_codec(base.payload_codec)} and the settings turn on "
            "turnkeep's encryption: use one of them. Your codec encodes turnkeep's payloads "
            "too; or remove it and let turnkeep encrypt (and `turnkeep codec-server` decrypt)."
        )
    if base.external_storage is not None and not same_storage(base.external_storage, storage):
        raise ValueError(
            f"the client stores large payloads in {describe_storage(base.external_storage)}, "
            f"the settings in {describe_storage(storage)}: pass yours to turnkeep too "
            "(TurnkeepPlugin(storage=...)), so one storage holds both."
        )
    failure = base.failure_converter_class
    if codec is not None and failure is DefaultFailureConverter:
        failure = DefaultFailureConverterWithEncodedAttributes
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    # No codec at all rather than a pass-through one where nothing needs one: the SDK then
    # skips a pass over every payload. An encrypted payload is refused by the payload converter
    # instead. With payload storage, sessions store their conversations beside it.
    payload_codec = base.payload_codec or codec
    store = conversation_store(storage)
    if store is not None:
        payload_codec = ConversationCodec(store, payload_codec)
    return TurnkeepDataConverter(
        **{
            **fields,
            "payload_converter_class": (
                StoringPayloadConverter if store is not None else TurnkeepPayloadConverter
            ),
            "payload_codec": payload_codec,
            "failure_converter_class": failure,
            "external_storage": storage,
        }
    )


def inner_codec(codec: PayloadCodec | None) -> PayloadCodec | None:
    """The codec under turnkeep's conversation store, if any: encryption, an application's
    own, or none."""
    return codec.inner if isinstance(codec, ConversationCodec) else codec


def with_converter(client: Client, converter: DataConverter) -> Client:
    """``client`` on the same connection with ``converter``: a worker converts payloads with
    its client's converter, and a worker plugin cannot change the client itself."""
    if converter is client.data_converter:
        return client
    config = client.config(active_config=True)
    # What the plugins did is in the active config already: don't let them do it again.
    config["plugins"] = []
    config["data_converter"] = converter
    return Client(**config)


def _check_storage(client: ExternalStorage | None, worker: ExternalStorage | None) -> None:
    if not same_storage(client, worker):
        raise ValueError(
            "the worker's client and its settings disagree on payload storage: the client has "
            f"{describe_storage(client)}, payload_storage in the settings gives "
            f"{describe_storage(worker)}. Connect the client with the same settings "
            "(turnkeep.connect(..., settings=settings)) so it can read what the worker "
            "stores; every other client of these turns needs the same storage too."
        )


def _check_codec(client: PayloadCodec | None, worker: PayloadCodec | None) -> None:
    # A worker whose client lacks the codec would write every payload in clear.
    if not same_codec(client, worker):
        raise ValueError(
            "the worker's client and its settings disagree on payload encryption: the client has "
            f"{describe_codec(client)}, encryption in the settings gives "
            f"{describe_codec(worker)}. Connect the client with the same settings "
            "(turnkeep.connect(..., settings=settings)): the worker writes payloads with its "
            "client's converter."
        )
