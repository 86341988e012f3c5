"""The script DSL: what one step of a script answers a request with, and ``Reply``, which builds
the steps."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Api = Literal["anthropic", "openai"]
APIS: tuple[Api, ...] = ("anthropic", "openai")
# How a streamed request is answered: as the API streams ("sse"), or misbehaving as some
# OpenAI-compatible servers and proxies do (the package's notes say how).
StreamedAs = Literal["sse", "json", "no_done", "no_stop"]


@dataclass(frozen=True)
class Tokens:
    input: int = 10
    output: int = 5
    cache_read: int = 0
    cache_write: int = 0
    # Report as `input` the request's own size instead (`limits.request_tokens`: its JSON's
    # characters / 4), so a workload's usage follows from what it sends.
    sized: bool = False

    @property
    def total(self) -> int:
        """Prompt + completion tokens: what a provider's tokens-per-minute limit counts."""
        return self.input + self.cache_read + self.cache_write + self.output


@dataclass(frozen=True)
class Answer:
    text: str | None = None
    # (call id, tool name, arguments); arguments given as a str are sent verbatim (bad JSON).
    calls: tuple[tuple[str, str, Any], ...] = ()
    thinking: str | None = None  # an Anthropic thinking block / OpenAI-compatible reasoning
    stop: str | None = None  # the API's own stop_reason / finish_reason, if not the natural one
    usage: Tokens = Tokens()
    # A streamed answer (the request asked for `stream`): seconds between its chunks, and an
    # event its last text chunk waits for (a test sets it once it has seen the first deltas);
    # answered whole (`streamed_as="json"`), it waits for that event before it is sent.
    chunk_delay: float = 0.0
    hold: threading.Event | None = None
    # time.monotonic() as each text chunk is sent, appended here (benchmarks).
    sent: list[float] | None = None
    streamed_as: StreamedAs = "sse"


@dataclass(frozen=True)
class Failure:
    status: int
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    code: str | None = None  # OpenAI's error.code; Anthropic's error.type
    kind: str | None = None  # OpenAI's error.type (unset: from the status)


@dataclass(frozen=True)
class Raw:
    status: int
    body: Any  # a str is sent verbatim, anything else as JSON
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "application/json"


@dataclass(frozen=True)
class Delay:
    seconds: float
    then: Step


@dataclass(frozen=True)
class Drop:
    pass


Step = Answer | Failure | Raw | Delay | Drop


class Reply:
    """Constructors for script steps."""

    @staticmethod
    def text(
        text: str,
        *,
        thinking: str | None = None,
        stop: str | None = None,
        usage: Tokens = Tokens(),
        chunk_delay: float = 0.0,
        hold: threading.Event | None = None,
        streamed_as: StreamedAs = "sse",
    ) -> Answer:
        return Answer(
            text=text,
            thinking=thinking,
            stop=stop,
            usage=usage,
            chunk_delay=chunk_delay,
            hold=hold,
            streamed_as=streamed_as,
        )

    @staticmethod
    def tool_calls(
        *calls: tuple[str, str, Any],
        text: str | None = None,
        stop: str | None = None,
        usage: Tokens = Tokens(),
        streamed_as: StreamedAs = "sse",
    ) -> Answer:
        return Answer(text=text, calls=calls, stop=stop, usage=usage, streamed_as=streamed_as)

    @staticmethod
    def error(
        status: int,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        code: str | None = None,
    ) -> Failure:
        return Failure(status, message, dict(headers or {}), code)

    @staticmethod
    def raw(
        status: int,
        body: Any,
        *,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Raw:
        return Raw(status, body, dict(headers or {}), content_type)

    @staticmethod
    def delay(seconds: float, then: Step) -> Delay:
        return Delay(seconds, then)

    @staticmethod
    def drop() -> Drop:
        return Drop()
