"""A model call across the workflow/activity boundary: the ``LlmRequest``; its JSON as a turn
keeps it, each message dumped and hashed once (``MessageJson``, ``RequestJson``); the reference
``llm_step`` receives instead of a copy (``LlmStepRequest``); and the pages the activity reads
the request by (the ``model_input`` query)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from operator import is_
from typing import Any

from pydantic import BaseModel, PrivateAttr

from turnkeep.contract.activity_io import ToolSpec
from turnkeep.contract.compact import Compact
from turnkeep.contract.messages import Message, estimate_chars

# The query `llm_step` reads its input through (see LlmStepRequest).
MODEL_INPUT_QUERY = "model_input"

# A message, its JSON's sha256 and its JSON (``MessageJson``).
JsonEntry = tuple[Message, str, str]


class LlmRequest(BaseModel):
    """Everything a provider needs for one model call: the conversation as the model sees it,
    the tools on offer and the request parameters."""

    agent: str
    model: str
    call_index: int  # 1-based number of this model call within the turn
    instruction: str | None
    messages: list[Message]
    tools: list[ToolSpec]
    structured_output: dict[str, Any] | None = None
    temperature: float | None = None
    max_tokens: int | None = None


@dataclass(frozen=True)
class RequestJson:
    """An ``LlmRequest`` as JSON: everything but the messages, and each message on its own
    with its sha256. Its digest is taken over those parts (the messages' through one running
    hash, ``JsonRun``), so a conversation that grows by a message costs one message's dump and
    hash, not the whole conversation's again."""

    header: str  # the request's JSON without "messages"
    messages: tuple[tuple[str, str], ...]  # (sha256, JSON) per message, in order
    messages_sha256: str  # over each message's sha256 and a newline, in order
    message_chars: int  # the messages' JSON, in characters

    @classmethod
    def of(cls, request: LlmRequest) -> RequestJson:
        return MessageJson().request_json(request)

    def digest(self) -> str:
        return _sha256(f"{self.header}\n{self.messages_sha256}")

    def chars(self) -> int:
        return len(self.header) + self.message_chars

    def parse(
        self, messages: Callable[[tuple[tuple[str, str], ...]], list[Message]] | None = None
    ) -> LlmRequest:
        """The request, its messages parsed by ``messages(parts)`` (which may answer from a
        cache) or else each on its own."""
        request = LlmRequest.model_validate_json(f'{self.header[:-1]},"messages":[]}}')
        request.messages = (messages or _parse_messages)(self.messages)
        return request


def _parse_messages(parts: tuple[tuple[str, str], ...]) -> list[Message]:
    return [Message.model_validate_json(text) for _, text in parts]


@dataclass(frozen=True)
class JsonRun:
    """The messages of a request, each one's (sha256, JSON), the running hash over their
    sha256s and their size: a later request that begins with the very same message objects
    (a turn's next call; a session's next turn, through ``conversation_cache``) takes all of
    it and works out only the messages after them."""

    messages: tuple[Message, ...]
    parts: tuple[tuple[str, str], ...]
    hasher: Any  # hashlib's sha256 over ``parts``' sha256s; copied, never updated in place
    chars: int

    def begins(self, messages: list[Message]) -> bool:
        """Whether ``messages`` begins with this run's message objects (identity: an equal
        copy is measured anew, as ``MessageJson`` does)."""
        return len(messages) >= len(self.messages) and all(map(is_, self.messages, messages))


class MessageJson:
    """Each message's JSON and sha256, and its size for token estimates, worked out once per
    message object over a turn's model calls. This relies on a message never being changed in
    place once it is in the conversation (``TurnState`` replaces one instead); each call keeps
    only the entries of its own messages, each with the message itself, so an id is never
    mistaken for another's. A request that begins with the last one's messages (as each call
    of a turn does) takes that request's ``JsonRun`` and goes through the new messages only.

    It trades memory for CPU: a turn cached on a worker holds its conversation's JSON next to
    the messages, where dumping the whole conversation for every model call would make a
    turn's CPU grow with the square of its length. A turn whose calls await a person's
    decision drops it (``waits.base.Wait.wait``): it may wait for hours, and it pays one
    dump of its conversation afterwards."""

    def __init__(
        self, entries: dict[int, JsonEntry] | None = None, run: JsonRun | None = None
    ) -> None:
        """``entries`` and ``run``: JSON already worked out for messages this turn holds (those
        of the conversation it was handed: ``conversation_cache``)."""
        self._by_id: dict[int, JsonEntry] = dict(entries or {})
        self._run = run
        self._estimates: dict[int, tuple[Message, int]] = {}

    @property
    def entries(self) -> dict[int, JsonEntry]:
        """The messages of the last request, with their JSON and sha256, by id."""
        return self._by_id

    @property
    def run(self) -> JsonRun | None:
        """The last request's messages as a ``JsonRun``."""
        return self._run

    def estimate_tokens(self, messages: list[Message]) -> int:
        """``messages.estimate_tokens``: the same number, measuring only new messages."""
        kept: dict[int, tuple[Message, int]] = {}
        chars = 0
        for message in messages:
            entry = self._estimates.get(id(message))
            if entry is None or entry[0] is not message:
                entry = (message, estimate_chars(message))
            kept[id(message)] = entry
            chars += entry[1]
        self._estimates = kept
        return chars // 4

    def request_json(self, request: LlmRequest) -> RequestJson:
        messages = request.messages
        run = self._run
        if run is not None and run.begins(messages):
            kept, known = self._by_id, run.parts
            hasher, chars, start = run.hasher.copy(), run.chars, len(run.messages)
        else:
            kept, known, hasher, chars, start = {}, (), hashlib.sha256(), 0, 0
        parts: list[tuple[str, str]] = []
        for message in messages[start:]:
            entry = self._by_id.get(id(message))
            if entry is None or entry[0] is not message:
                text = message.model_dump_json()
                entry = (message, _sha256(text), text)
            kept[id(message)] = entry
            parts.append(entry[1:])
            hasher.update(f"{entry[1]}\n".encode())
            chars += len(entry[2])
        self._by_id = kept
        self._run = JsonRun(tuple(messages), known + tuple(parts), hasher, chars)
        return RequestJson(
            header=request.model_dump_json(exclude={"messages"}),
            messages=self._run.parts,
            messages_sha256=hasher.hexdigest(),
            message_chars=chars,
        )


class LlmStepRequest(Compact):
    """The input of ``llm_step``: a reference to the ``LlmRequest``, not a copy.

    Copying the conversation into every model call's input would record it again on each
    iteration, so workflow history would grow with the square of the turn's length. The
    conversation is recorded once (turn input, activity results); ``llm_step`` reads the
    request it should make through a query of the running workflow, and checks the digest so
    it can only ever send exactly what the workflow meant."""

    agent: str
    model: str
    call_index: int
    workflow_id: str
    run_id: str
    digest: str  # request_digest() of the LlmRequest
    # The agent call whose inline loop makes this call (``inline_agent``): the workflow holds
    # its request under this key, its call index being the called agent's own.
    inline: str | None = None

    # The request as JSON parts, in this process's memory only (a private attribute is never
    # serialized): the worker that schedules the call hands them to ``llm_step`` without
    # dumping the conversation again (``ModelInputHandoff``).
    _request_json: RequestJson | None = PrivateAttr(default=None)

    @classmethod
    def referencing(
        cls,
        request: LlmRequest,
        *,
        workflow_id: str,
        run_id: str,
        messages: MessageJson | None = None,
        inline: str | None = None,
    ) -> LlmStepRequest:
        """The reference to ``request`` in this workflow run. With the turn's ``messages``
        (kept across its model calls), only messages new since the last call are dumped."""
        request_json = (messages or MessageJson()).request_json(request)
        step = cls(
            agent=request.agent,
            model=request.model,
            call_index=request.call_index,
            workflow_id=workflow_id,
            run_id=run_id,
            digest=request_json.digest(),
            inline=inline,
        )
        step._request_json = request_json
        return step

    def header_chars(self) -> int:
        """The characters of the request's JSON besides its messages: its instruction (the
        system prompt), tool definitions and output schema, which the provider counts too.
        Measured on the JSON the reference was built from, so it costs nothing more (0 once
        that JSON is handed on, or where this reference was not built)."""
        return len(self._request_json.header) if self._request_json is not None else 0

    def pop_request_json(self) -> RequestJson | None:
        """The request's JSON, once, on the worker that built this reference (None elsewhere):
        afterwards the step holds only the reference, however long the SDK keeps it."""
        request_json, self._request_json = self._request_json, None
        return request_json


def request_digest(request: LlmRequest) -> str:
    return RequestJson.of(request).digest()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# Query answers are payloads too: pages stay below the external-storage threshold, so reading
# the conversation never writes a copy of it anywhere.
MODEL_INPUT_PAGE_BYTES = 192 * 1024


class ModelInputPage(BaseModel):
    """Part of an ``LlmRequest``: the first page has everything but later messages; the
    others only ``messages[start:...]``."""

    request: LlmRequest
    total_messages: int


def page_end(messages: list[Message], start: int) -> int:
    """Where the page of ``messages`` that begins at ``start`` ends: at least one message,
    and no more than ``MODEL_INPUT_PAGE_BYTES`` of them (a query's answer)."""
    end, size = start, 0
    while end < len(messages):
        size += len(messages[end].model_dump_json())
        if end > start and size > MODEL_INPUT_PAGE_BYTES:
            break
        end += 1
    return end


def model_input_page(request: LlmRequest, start: int) -> ModelInputPage:
    """The page of ``request`` that begins at message ``start`` (always at least one)."""
    end = page_end(request.messages, start)
    update: dict[str, Any] = {"messages": request.messages[start:end]}
    if start > 0:
        update["tools"] = []
        update["instruction"] = None
    return ModelInputPage(
        request=request.model_copy(update=update), total_messages=len(request.messages)
    )
