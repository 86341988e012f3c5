"""What the two wire formats share: the shape of a format, a streamed event, how a model streams
text, and a misbehaving stream's cut."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Protocol

from turnkeep.testing.fake_api.limits import Refusal
from turnkeep.testing.fake_api.steps import Answer, Failure, StreamedAs

# A streamed event: (SSE event name or None, JSON body or the literal data, is a text chunk).
Event = tuple[str | None, Any, bool]


class WireFormat(Protocol):
    """One API as the fake serves it: the module of each format (``anthropic``, ``openai``) is
    one."""

    ROUTE: str  # where it is served
    ENDING: str  # what a path mounted for it ends with
    REQUEST_ID_HEADER: str

    def answer_body(self, answer: Answer, model: str) -> dict[str, Any]:
        """The whole answer's body, for the model the request named."""

    def events(self, answer: Answer, model: str, request: dict[str, Any]) -> list[Event]:
        """The same answer streamed, given the request's body (what it asked the stream for)."""

    def error_body(self, failure: Failure) -> dict[str, Any]: ...

    def rate_limited(self, refusal: Refusal, model: str) -> Failure:
        """The 429 its API answers beyond a rate limit, with the headers it sends."""

    def is_stop(self, event: Event) -> bool:
        """Whether an event of its stream carries the stop reason."""


def text_pieces(text: str) -> list[str]:
    """A text as a model streams it: word by word, each with the spaces after it."""
    return re.findall(r"\s*\S+\s*", text) or [text]


def cut(
    events: list[Event], streamed_as: StreamedAs, is_stop: Callable[[Event], bool]
) -> list[Event]:
    """A stream without its closing event ("no_done"), or without its stop reason as well
    ("no_stop": the event ``is_stop`` finds, and everything after it)."""
    if streamed_as == "no_done":
        return events[:-1]
    if streamed_as != "no_stop":
        return events
    stop = next(i for i, event in enumerate(events) if is_stop(event))
    return events[:stop]
