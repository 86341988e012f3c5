"""A live-text batch as one event's data (``turnkeep.payloads.live_batch``): what the worker's
converter writes, a client's converter reads back; encrypted when the converter encrypts."""

from __future__ import annotations

import base64
import os

import pytest

from turnkeep.contract.live_io import LiveDelta
from turnkeep.payloads.codec import EncryptionCodec
from turnkeep.payloads.composition import data_converter
from turnkeep.payloads.live_batch import decode_batch, encode_batch

pytestmark = pytest.mark.asyncio

DELTAS = [
    LiveDelta(kind="text", text="a secret, line\nby line"),
    LiveDelta(kind="tool_call", name="search", call_id="c1"),
]


async def test_a_batch_reads_back_as_written() -> None:
    converter = data_converter(None)
    data = await encode_batch(converter, DELTAS)
    assert await decode_batch(converter, data) == DELTAS


async def test_an_encrypted_batch_needs_the_key() -> None:
    codec = EncryptionCodec({"k": os.urandom(32)}, "k")
    data = await encode_batch(data_converter(None, codec), DELTAS)
    assert b"secret" not in base64.b64decode(data)
    assert await decode_batch(data_converter(None, codec), data) == DELTAS
