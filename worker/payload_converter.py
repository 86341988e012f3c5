"""turnkeep's payload converter: Temporal's pydantic converter, built once per process.

The SDK builds a new payload converter every time it derives a data converter for a context,
which it does for every workflow activation and every activity task. Temporal's
``PydanticPayloadConverter`` makes a fresh JSON converter each time, and with it an empty cache
of pydantic ``TypeAdapter``s, so every activity rebuilt the adapters for its input and result
types (about a twentieth of a busy worker's time on a quick turn, in ``bench``'s profile). This
class shares one JSON converter, and so one adapter cache, across all of them. The converter
holds no per-call state and ``functools.lru_cache`` is thread-safe, so workflow threads and the
activity event loop can share it. The types it caches are the passthrough ``workflows``
modules' (``worker/workflow_runner.py``), the same objects in and out of the sandbox, so the
cache does not grow with each workflow run.
"""

from __future__ import annotations

from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
)

from worker.codec import EncryptedPayloadRefusal

_JSON = PydanticJSONPlainPayloadConverter()
_REFUSE_ENCRYPTED = EncryptedPayloadRefusal()
# Temporal's defaults with the shared JSON converter, by encoding, built once: the SDK
# constructs this class for every payload it converts (a ``dataclasses.replace`` of the data
# converter re-runs its ``__post_init__``), ~15 times per turn iteration with payload storage on.
_CONVERTERS = {
    c.encoding.encode(): c
    for c in (
        *(
            _JSON if isinstance(c, JSONPlainPayloadConverter) else c
            for c in DefaultPayloadConverter.default_encoding_payload_converters
        ),
        _REFUSE_ENCRYPTED,
    )
}


class TurnkeepPayloadConverter(CompositePayloadConverter):
    """``temporalio.contrib.pydantic.PydanticPayloadConverter`` with a shared JSON converter,
    and one that names the missing ``encryption`` config when it meets an encrypted payload
    (with encryption on, the codec decrypts every payload before this converter sees it)."""

    def __init__(self) -> None:
        # Shared, not copied: nothing mutates the mapping (``with_context`` gives a new
        # instance its own), and building it was most of this constructor's cost.
        self.converters = _CONVERTERS
