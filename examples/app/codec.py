"""The app's own payload codec: every payload zlib-compressed. turnkeep's plugin keeps it,
adding its own converter and payload storage around it."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, PayloadCodec

ENCODING = b"binary/zlib"


class ZlibCodec(PayloadCodec):
    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload(metadata={"encoding": ENCODING}, data=zlib.compress(p.SerializeToString()))
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        decoded = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                decoded.append(payload)  # not ours (written before the codec, say)
                continue
            original = Payload()
            original.ParseFromString(zlib.decompress(payload.data))
            decoded.append(original)
        return decoded


DATA_CONVERTER = DataConverter(payload_codec=ZlibCodec())
