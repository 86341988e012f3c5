"""turnkeep's payload converter (``turnkeep.payloads.converter``): pydantic JSON as Temporal's
pydantic converter writes it, with one cache of type adapters however many data converters
the SDK derives (one per activation and per activity task)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import StorageDriverStoreContext, WorkflowSerializationContext

from turnkeep.config.settings import PayloadStorageSettings
from turnkeep.payloads.codec import EncryptionCodec, EncryptionNotConfiguredError
from turnkeep.payloads.composition import data_converter
from turnkeep.payloads.converter import _JSON
from turnkeep.payloads.storage import external_storage
from turnkeep.workflows.messages import Message
from turnkeep.workflows.model_io import LlmStepRequest

STEP = LlmStepRequest(
    agent="a", model="m", call_index=1, workflow_id="w", run_id="r", digest="d" * 64
)


def test_payloads_are_what_temporals_pydantic_converter_writes() -> None:
    mine = data_converter(None).payload_converter
    theirs = pydantic_data_converter.payload_converter
    for value in (STEP, Message.user("hi"), {"plain": [1, 2]}, None, b"bytes"):
        assert mine.to_payloads([value]) == theirs.to_payloads([value])
    [payload] = mine.to_payloads([STEP])
    assert mine.from_payloads([payload], [LlmStepRequest]) == [STEP]


def test_derived_converters_share_one_adapter_cache(tmp_path: Path) -> None:
    # With payload storage, as by default: the SDK then rebuilds the converter per context.
    base = data_converter(external_storage(PayloadStorageSettings(path=tmp_path)))
    [payload] = base.payload_converter.to_payloads([STEP])
    _JSON._type_adapter.cache_clear()
    for i in range(20):  # what the SDK does for every activation and activity task
        derived = base._with_contexts(
            WorkflowSerializationContext(namespace="default", workflow_id=f"wf-{i}"),
            StorageDriverStoreContext(target=None),
        )
        assert derived.payload_converter is not base.payload_converter
        assert derived.payload_converter.from_payloads([payload], [LlmStepRequest]) == [STEP]
    info = _JSON._type_adapter.cache_info()
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
