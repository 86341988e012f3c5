"""A batch of live text as the data of a server-sent event: written by the worker's live-stream
server, read by a client following the turn (``turnkeep.contract.live_io`` has the types).

The batch is the ``Payload`` the data converter's payload converter and codec make of a
``LiveBatch``, serialized and base64-encoded: with encryption on, the text travels encrypted
with the turn's key. External storage is left out both ways: a batch is never stored, and
decoding through it costs more than the rest.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter

from turnkeep.contract.live_io import LiveBatch, LiveDelta


async def encode_batch(converter: DataConverter, deltas: Sequence[LiveDelta]) -> str:
    """``deltas`` as one event's data."""
    payloads = converter.payload_converter.to_payloads([LiveBatch(deltas=list(deltas))])
    if converter.payload_codec is not None:
        payloads = await converter.payload_codec.encode(payloads)
    return base64.b64encode(payloads[0].SerializeToString()).decode("ascii")


async def decode_batch(converter: DataConverter, data: str) -> list[LiveDelta]:
    """The deltas an event's data holds (none if it is not a ``LiveBatch``)."""
    payload = Payload()
    payload.ParseFromString(base64.b64decode(data))
    payloads = [payload]
    if converter.payload_codec is not None:
        payloads = await converter.payload_codec.decode(payloads)
    batch = converter.payload_converter.from_payloads(payloads, [LiveBatch])[0]
    return list(batch.deltas) if isinstance(batch, LiveBatch) else []
