"""turnkeep's payload converter (``turnkeep.payloads.converter``): pydantic JSON as Temporal's
pydantic converter writes it, with one cache of type adapters however many data converters
the SDK derives (one per activation and per activity task)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import StorageDriverStoreContext, WorkflowSerializationContext

from tests.conftest import forged_expansion
from turnkeep.config.settings import PayloadStorageSettings
from turnkeep.contract.activity_io import PrepareTurnRequest
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import LlmStepRequest
from turnkeep.contract.turn_io import TurnInput, TurnOverrides
from turnkeep.payloads.codec import EncryptionCodec, EncryptionNotConfiguredError
from turnkeep.payloads.composition import data_converter
from turnkeep.payloads.converter import _STORING_JSON
from turnkeep.payloads.storage import external_storage

# Every field set: a payload leaves out only fields that hold their defaults (``Compact``).
STEP = LlmStepRequest(
    agent="a", model="m", call_index=1, workflow_id="w", run_id="r", digest="d" * 64, inline="i"
)


def test_payloads_are_what_temporals_pydantic_converter_writes() -> None:
    mine = data_converter(None).payload_converter
    theirs = pydantic_data_converter.payload_converter
    for value in (STEP, {"plain": [1, 2]}, None, b"bytes"):
        assert mine.to_payloads([value]) == theirs.to_payloads([value])
    [payload] = mine.to_payloads([STEP])
    assert mine.from_payloads([payload], [LlmStepRequest]) == [STEP]


def test_what_a_payload_leaves_out_reading_it_back_restores() -> None:
    """A model call's answer and the activities' compact models leave out their unset fields
    and defaults, in every turn's history; Temporal's own converter reads them back whole."""
    mine = data_converter(None).payload_converter
    theirs = pydantic_data_converter.payload_converter
    request = PrepareTurnRequest(agent="a", overrides=TurnOverrides(temperature=0.5))
    for value in (Message.assistant("hi"), request):
        [compact] = mine.to_payloads([value])
        [full] = theirs.to_payloads([value])
        assert len(compact.data) < len(full.data)
        assert theirs.from_payloads([compact], [type(value)]) == [value]
    assert mine.to_payloads([request])[0].data == b'{"agent":"a","overrides":{"temperature":0.5}}'
    # Dumped for anything but a payload (a client's JSON), every field is there.
    assert "depth" in request.model_dump_json()


def test_derived_converters_share_one_adapter_cache(tmp_path: Path) -> None:
    # With payload storage, as by default: the SDK then rebuilds the converter per context
    # (the one that writes a session's conversation by reference).
    base = data_converter(external_storage(PayloadStorageSettings(path=tmp_path)))
    [payload] = base.payload_converter.to_payloads([STEP])
    _STORING_JSON._type_adapter.cache_clear()
    for i in range(20):  # what the SDK does for every activation and activity task
        derived = base._with_contexts(
            WorkflowSerializationContext(namespace="default", workflow_id=f"wf-{i}"),
            StorageDriverStoreContext(target=None),
        )
        assert derived.payload_converter is not base.payload_converter
        assert derived.payload_converter.from_payloads([payload], [LlmStepRequest]) == [STEP]
    info = _STORING_JSON._type_adapter.cache_info()
    assert (info.misses, info.hits) == (1, 19)


async def test_without_encryption_there_is_no_codec_and_an_encrypted_payload_says_why() -> None:
    plain = data_converter(None)
    # No pass-through codec: the SDK skips its codec pass over every payload.
    assert plain.payload_codec is None
    [sealed] = await EncryptionCodec({"k7": os.urandom(32)}, "k7").encode(
        plain.payload_converter.to_payloads([STEP])
    )
    with pytest.raises(EncryptionNotConfiguredError, match=r"encrypted with key 'k7'.*no `encr"):
        await plain.decode([sealed], [LlmStepRequest])
    # Nothing is ever written as encrypted by the converter itself.
    assert (
        plain.payload_converter.to_payloads([b"raw"])[0].metadata["encoding"] != b"binary/encrypted"
    )


def test_the_converter_leaves_only_a_conversation_as_json() -> None:
    """Whoever set the metadata, only a conversation field stays JSON (to be validated as
    messages); any other field a client claims was expanded is parsed as it is."""
    converter = data_converter(None).payload_converter
    document = {"agent": "test", "messages": ["hi"], "history": []}
    [claimed] = converter.from_payloads([forged_expansion(document, "messages")])
    assert claimed == document
    [history] = converter.from_payloads([forged_expansion(document, "history")])
    assert history["history"] == b"[]" and TurnInput.model_validate(history) == TurnInput(
        agent="test", messages=["hi"]
    )
