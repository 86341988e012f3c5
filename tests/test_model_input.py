"""How ``llm_step`` gets the request it sends: from the memory of the worker that scheduled it
(the in-process hand-off), or by query of the workflow, and in both cases only ever exactly the
request the workflow's digest names."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.conftest import HarnessFactory, make_settings, write_script
from turnkeep.activities import model as model_activity
from turnkeep.activities import model_input
from turnkeep.activities.model_input import ModelInputHandoff
from turnkeep.client.turns import start_turn
from turnkeep.contract import messages as messages_module
from turnkeep.contract import model_io
from turnkeep.contract.messages import Message, estimate_tokens
from turnkeep.contract.model_io import (
    LlmRequest,
    LlmStepRequest,
    MessageJson,
    RequestJson,
    request_digest,
)
from turnkeep.contract.turn_io import TurnInput, TurnResult
from turnkeep.providers.parsed_messages import ParsedMessages
from turnkeep.worker.build import build_worker


def request(call_index: int = 1, text: str = "hello") -> LlmRequest:
    return LlmRequest(
        agent="a",
        model="m",
        call_index=call_index,
        instruction=None,
        messages=[Message.user(text)],
        tools=[],
    )


def step_for(req: LlmRequest, run_id: str = "r") -> LlmStepRequest:
    return LlmStepRequest.referencing(req, workflow_id="w", run_id=run_id)


def test_a_step_built_here_carries_its_json_but_never_serializes_it() -> None:
    req = request(text="private conversation")
    step = step_for(req)
    assert step.digest == request_digest(req)
    wire = step.model_dump_json()
    assert "private conversation" not in wire
    # What a worker receives from the server: the reference alone.
    assert LlmStepRequest.model_validate_json(wire).pop_request_json() is None
    # Here, once: the hand-off takes it, and the step keeps only the reference.
    request_json = step.pop_request_json()
    assert request_json == RequestJson.of(req) and request_json.parse() == req
    assert step.pop_request_json() is None


def test_a_turns_messages_are_dumped_once_and_the_digest_is_the_same() -> None:
    turn = MessageJson()
    first = [Message.user("hello"), Message.assistant("hi")]
    before = turn.request_json(request().model_copy(update={"messages": first}))
    grown = [*first, Message.user("more")]
    after = turn.request_json(request().model_copy(update={"messages": grown}))
    # The messages the last call had are not dumped again: the very same strings.
    assert all(a[1] is b[1] for a, b in zip(after.messages, before.messages, strict=False))
    # Kept or not, the digest is what a fresh reading of the request gives (as on the query
    # path), and it changes with any part of the request.
    assert after.digest() == request_digest(request().model_copy(update={"messages": grown}))
    replaced = [first[0], first[1].model_copy(update={"content": []}), grown[2]]
    changed = turn.request_json(request().model_copy(update={"messages": replaced}))
    assert changed.messages[1][1] is not after.messages[1][1]
    assert changed.digest() != after.digest()
    assert after.digest() != request_digest(
        request(call_index=2).model_copy(update={"messages": grown})
    )


def test_a_turns_token_estimate_measures_each_message_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured: list[Message] = []

    def counting(message: Message) -> int:
        measured.append(message)
        return messages_module.estimate_chars(message)

    monkeypatch.setattr(model_io, "estimate_chars", counting)
    turn = MessageJson()
    first = [Message.user("x" * 5000), Message.assistant("hi")]
    assert turn.estimate_tokens(first) == estimate_tokens(first)
    grown = [*first, Message.user("more")]
    # The compaction check's number (the workflow's, so replay decides the same), for the
    # new message's measure alone.
    assert turn.estimate_tokens(grown) == estimate_tokens(grown)
    assert measured == [*first, grown[2]]
    replaced = [first[0], Message.assistant("hi")]  # equal, but another object: measured
    assert turn.estimate_tokens(replaced) == estimate_tokens(replaced)
    assert measured[-1] is replaced[1]


def test_the_scheduling_process_hands_over_an_equal_request() -> None:
    handoff = ModelInputHandoff()
    req = request()
    step = step_for(req)
    handoff.offer(step)
    assert step.pop_request_json() is None  # moved into the hand-off, not copied
    received = LlmStepRequest.model_validate_json(step.model_dump_json())
    taken = handoff.take(received)
    assert taken == req and taken is not req
    assert handoff.take(received) is None  # taken once


def test_a_request_that_does_not_match_the_digest_is_never_handed_over() -> None:
    handoff = ModelInputHandoff()
    handoff.offer(step_for(request(text="what the workflow meant")))
    other = step_for(request(text="something else"))
    assert handoff.take(other) is None


def test_a_step_from_elsewhere_is_not_offered() -> None:
    handoff = ModelInputHandoff()
    received = LlmStepRequest.model_validate_json(step_for(request()).model_dump_json())
    handoff.offer(received)  # no JSON: built by another process
    assert handoff.take(received) is None


def test_untaken_requests_are_dropped_oldest_first() -> None:
    size = RequestJson.of(request(1)).chars()
    handoff = ModelInputHandoff(max_bytes=2 * size + size // 2)
    steps = [step_for(request(i)) for i in (1, 2, 3)]
    for step in steps:
        handoff.offer(step)
    assert handoff.take(steps[0]) is None
    assert handoff.take(steps[1]) is not None and handoff.take(steps[2]) is not None


def test_a_handed_over_request_parses_only_messages_new_since_the_last_call() -> None:
    parsed = ParsedMessages()
    handoff = ModelInputHandoff(parsed=parsed)
    turn = MessageJson()
    messages = [Message.user("x" * 5000), Message.assistant("hi")]
    first_request = request().model_copy(update={"messages": messages})
    handoff.offer(
        LlmStepRequest.referencing(first_request, workflow_id="w", run_id="r", messages=turn)
    )
    first = handoff.take(step_for(first_request))
    grown = request(call_index=2).model_copy(update={"messages": [*messages, Message.user("more")]})
    handoff.offer(LlmStepRequest.referencing(grown, workflow_id="w", run_id="r", messages=turn))
    second = handoff.take(step_for(grown))
    assert first == first_request and second == grown
    # The messages of the first call are the very objects parsed for it; never the workflow's.
    assert first is not None and second is not None
    assert all(a is b for a, b in zip(second.messages, first.messages, strict=False))
    assert not any(a is b for a, b in zip(second.messages, grown.messages, strict=True))
    assert len(parsed) == 3
    # Token estimates: the same as the workflow's, for parsed messages and any other.
    for some in (second.messages, grown.messages, [Message.assistant("new")]):
        assert parsed.estimate_tokens(some) == estimate_tokens(some)


def test_a_request_that_begins_as_the_last_one_goes_through_the_new_messages_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn's next call, and a session's next turn (a new ``MessageJson`` given the last
    one's run), dump, hash and parse only the messages after the last request's; the digest
    and the JSON are what a fresh reading gives."""
    turn = MessageJson()
    messages = [Message.user("hello"), Message.assistant("hi")]
    first = turn.request_json(request().model_copy(update={"messages": messages}))
    grown = [*messages, Message.user("more")]
    dumped: list[Message] = []
    dump = Message.model_dump_json

    def counting(self: Message, **kwargs: Any) -> str:
        dumped.append(self)
        return dump(self, **kwargs)

    monkeypatch.setattr(Message, "model_dump_json", counting)
    next_turn = MessageJson(turn.entries, turn.run)  # as conversation_cache hands it over
    second = next_turn.request_json(request(call_index=2).model_copy(update={"messages": grown}))
    monkeypatch.undo()
    assert dumped == [grown[2]]
    assert second.messages[:2] == first.messages and second.messages[0] is first.messages[0]
    fresh = RequestJson.of(request(call_index=2).model_copy(update={"messages": grown}))
    assert second == fresh and second.digest() == fresh.digest()
    assert (
        second.chars()
        == fresh.chars()
        == len(fresh.header) + sum(len(m.model_dump_json()) for m in grown)
    )
    # A request that does not begin with those very objects is worked out anew.
    copies = [m.model_copy() for m in grown]
    again = next_turn.request_json(request(call_index=3).model_copy(update={"messages": copies}))
    assert again.messages[0] is not second.messages[0] and again.messages == second.messages

    # The activity's side: the second request's messages are the first's list, extended.
    parsed = ParsedMessages()
    one = parsed.messages(first.messages)
    two = parsed.messages(second.messages)
    assert two[:2] == one and all(a is b for a, b in zip(one, two, strict=False))
    assert [m.model_dump_json() for m in two] == [text for _, text in second.messages]
    other = parsed.messages((("elsewhere", Message.user("x").model_dump_json()),))
    assert other[0].text == "x"
    assert parsed.estimate_tokens(two) == estimate_tokens(grown)
    assert parsed.estimate_tokens(one) == estimate_tokens(messages)  # shorter: measured anew


def test_parsed_messages_are_dropped_least_recently_sent_first() -> None:
    texts = {name: Message.user(name * 100).model_dump_json() for name in "abc"}
    parsed = ParsedMessages(max_chars=2 * len(texts["a"]) + 10)
    a = parsed.parse("sha-a", texts["a"])
    b = parsed.parse("sha-b", texts["b"])
    assert parsed.parse("sha-a", texts["a"]) is a  # sent again: now the most recent
    parsed.parse("sha-c", texts["c"])  # over the limit: b, the least recently sent, goes
    assert len(parsed) == 2 and parsed.parse("sha-a", texts["a"]) is a
    # An estimate for a message no longer kept is still right; sent again, it is parsed again.
    assert parsed.estimate_tokens([b]) == estimate_tokens([b])
    assert parsed.parse("sha-b", texts["b"]) is not b


class RecordingHandoff(ModelInputHandoff):
    def __init__(self) -> None:
        super().__init__()
        self.taken: list[int] = []
        self.missed: list[int] = []

    def take(self, step: LlmStepRequest) -> LlmRequest | None:
        found = super().take(step)
        (self.taken if found is not None else self.missed).append(step.call_index)
        return found


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> RecordingHandoff:
    """This process's hand-off, replaced by one that records which calls found their input."""
    handoff = RecordingHandoff()
    # The activity takes from it, the interceptor offers to it: one object, two modules.
    monkeypatch.setattr(model_activity, "MODEL_INPUTS", handoff)
    monkeypatch.setattr(model_input, "MODEL_INPUTS", handoff)
    return handoff


def echo(text: str) -> str:
    """Echoes its argument."""
    return text


def echo_agent(tmp_path: Path) -> dict[str, Any]:
    call = {"tool_calls": {"c1": {"name": "local__echo", "arguments": {"text": "x" * 5000}}}}
    script = write_script(tmp_path / "script.json", call, call, "done")
    return {"test": {"model": "playback", "playback": str(script), "servers": ["local"]}}


@pytest.mark.asyncio
async def test_model_calls_on_the_scheduling_worker_take_their_input_from_memory(
    harness: HarnessFactory, tmp_path: Path, recording: RecordingHandoff
) -> None:
    async with harness({"local": [echo]}, agents=echo_agent(tmp_path)) as h:
        result: TurnResult = await h.run("go")
    assert result.final is not None and result.final.text == "done"
    # Every model call of the turn read its input here, none by query.
    assert recording.taken == [1, 2, 3] and recording.missed == []


@pytest.mark.asyncio
async def test_without_the_hand_off_every_call_reads_its_input_by_query(
    client: Client, tmp_path: Path, recording: RecordingHandoff
) -> None:
    settings = make_settings(tmp_path, agents=echo_agent(tmp_path))
    queue = f"by-query-{uuid.uuid4().hex[:8]}"
    worker = build_worker(
        client,
        settings,
        function_tools={"local": [echo]},
        task_queue=queue,
        model_input_handoff=False,
    )
    async with worker:
        turn = TurnInput(agent="test", messages=["go"])
        handle = await start_turn(client, turn, task_queue=queue)
        result = await handle.result()
    # The same turn, its requests read page by page and checked against the digest.
    assert result.final is not None and result.final.text == "done"
    assert [len(m.tool_results or {}) for m in result.messages if m.role == "user"] == [0, 1, 1]
    assert recording.taken == [] and recording.missed == [1, 2, 3]
