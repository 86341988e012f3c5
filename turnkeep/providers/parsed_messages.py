"""Messages of model calls' inputs, parsed once per worker process.

A turn's model calls on one worker get their input handed over as JSON, message by message
with each one's sha256 (``model_io.RequestJson``), and call *n+1* repeats every message of
call *n*. Parsing (and measuring, for the offline models' token estimates) only the messages
new since the last call keeps a model call's cost on the activity side independent of the
conversation's length, as ``model_io.MessageJson`` does on the workflow side.

The parsed ``Message`` objects are shared by the calls that send them, so a provider must
treat its request as read-only (the providers' tests check that every one does). They
are never shared with workflow state: they are parsed here from JSON.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from operator import is_

from turnkeep.contract.messages import Message, estimate_chars

# Enough for the conversations of the turns in flight on a worker; beyond it the least
# recently sent messages are parsed again when next sent.
MAX_CHARS = 64 * 1024 * 1024


@dataclass
class _Parsed:
    message: Message
    json_chars: int
    estimate: int | None = None  # estimate_chars(message), once asked for


@dataclass(frozen=True)
class _Run:
    parts: tuple[tuple[str, str], ...]
    messages: list[Message]
    chars: int


class ParsedMessages:
    """Messages by the sha256 of their JSON, least recently sent dropped first beyond
    ``max_chars`` of JSON. Used from the worker's event loop only (async activities)."""

    def __init__(self, max_chars: int = MAX_CHARS) -> None:
        self._max_chars = max_chars
        self._chars = 0
        self._by_sha: OrderedDict[str, _Parsed] = OrderedDict()
        # The same entries by the message's id, for estimates; each holds its message, so
        # an id here is never a recycled one.
        self._by_id: dict[int, _Parsed] = {}
        # The last requests' messages by the sha256 of their first (``messages``), bounded as
        # the table by their JSON (they share their messages with it); and the last list
        # measured, with its estimate (``estimate_tokens``).
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._run_chars = 0
        self._estimated: tuple[tuple[Message, ...], int] | None = None

    def parse(self, sha256: str, text: str) -> Message:
        """The message whose JSON is ``text`` (with sha256 ``sha256``, as the workflow that
        built the request computed it)."""
        parsed = self._by_sha.get(sha256)
        if parsed is not None:
            self._by_sha.move_to_end(sha256)
            return parsed.message
        parsed = _Parsed(Message.model_validate_json(text), len(text))
        self._by_sha[sha256] = parsed
        self._by_id[id(parsed.message)] = parsed
        self._chars += parsed.json_chars
        while self._chars > self._max_chars and len(self._by_sha) > 1:
            _, dropped = self._by_sha.popitem(last=False)
            del self._by_id[id(dropped.message)]
            self._chars -= dropped.json_chars
        return parsed.message

    def messages(self, parts: Sequence[tuple[str, str]]) -> list[Message]:
        """The messages whose (sha256, JSON) are ``parts``, in order. Those of a request that
        begins as an earlier one did (a turn's next call, a session's next turn: requests
        grow at their end) are that request's list, without a look at each message."""
        if not parts:
            return []
        run = self._runs.pop(parts[0][0], None)
        if run is not None:
            self._run_chars -= run.chars
        if run is not None and run.parts == parts[: len(run.parts)]:
            new = parts[len(run.parts) :]
            messages = run.messages + [self.parse(sha, text) for sha, text in new]
            chars = run.chars + sum(len(text) for _, text in new)
        else:
            messages = [self.parse(sha, text) for sha, text in parts]
            chars = sum(len(text) for _, text in parts)
        self._runs[parts[0][0]] = _Run(tuple(parts), messages, chars)
        self._run_chars += chars
        while self._run_chars > self._max_chars and len(self._runs) > 1:
            _, dropped = self._runs.popitem(last=False)
            self._run_chars -= dropped.chars
        return messages

    def estimate_tokens(self, messages: list[Message]) -> int:
        """``contract.messages.estimate_tokens``, measuring each parsed message once (and,
        for a list that begins as the last one measured did, only the messages after it)."""
        last = self._estimated
        if last is not None and len(messages) >= len(last[0]) and all(map(is_, last[0], messages)):
            counted, chars = last
        else:
            counted, chars = (), 0
        for message in messages[len(counted) :]:
            parsed = self._by_id.get(id(message))
            if parsed is None or parsed.message is not message:
                chars += estimate_chars(message)
                continue
            if parsed.estimate is None:
                parsed.estimate = estimate_chars(message)
            chars += parsed.estimate
        self._estimated = (tuple(messages), chars)
        return chars // 4

    def __len__(self) -> int:
        return len(self._by_sha)


# One per process, as the hand-off it parses for (``turnkeep.activities.model_input``).
PARSED_MESSAGES = ParsedMessages()


def estimate_tokens(messages: list[Message]) -> int:
    """A rough token count of ``messages`` for models that report none (as the workflow's
    ``estimate_tokens``), cheap for messages a model call's hand-off parsed here."""
    return PARSED_MESSAGES.estimate_tokens(messages)
