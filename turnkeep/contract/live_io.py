"""Live text on the wire: the address a streaming model call heartbeats (``LiveAddress``) and
the batches of deltas its stream carries. The worker's live-stream server writes them, a
client's reader decodes them; neither is workflow code, but both sides share these models."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# A call's stream on the worker's live-stream server: GET PATH_PREFIX + LiveAddress.call_key.
PATH_PREFIX = "/v1/calls/"
# The stream's server-sent event types: a ``LiveBatch`` of deltas, and the call's end.
DELTA_EVENT = "delta"
END_EVENT = "end"


class LiveAddress(BaseModel):
    """Where the live text of one attempt of a model call is served: ``llm_step``'s heartbeat
    details. ``token`` is a random secret of this attempt; only clients allowed to describe
    the turn's workflow see it (and, with encryption on, only encrypted)."""

    url: str  # the worker's live-stream server, e.g. http://127.0.0.1:38211
    call_key: str  # random id of this attempt's stream on that server
    token: str
    call_index: int
    attempt: int


class LiveDelta(BaseModel):
    """One delta on the wire: a piece of text, or the start of a tool call."""

    kind: Literal["text", "tool_call"]
    text: str = ""
    name: str | None = None  # tool_call: the tool
    call_id: str | None = None  # tool_call: the call's id


class LiveBatch(BaseModel):
    """The deltas of one SSE event (all those emitted since the previous event), encoded with
    the worker's data converter: with encryption on, encrypted with the turn's key."""

    deltas: list[LiveDelta]
