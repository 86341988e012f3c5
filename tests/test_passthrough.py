"""fast-agent parity of the offline models and of the loop's edge cases: the passthrough
model's echo and ``***FIXED_RESPONSE``, directly and through real turns, and a model that stops
for tool use without asking for any tool."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import HarnessFactory, write_script
from turnkeep.contract.messages import CallToolResult, Message, StopReason, TextContent
from turnkeep.contract.model_io import LlmRequest
from turnkeep.providers.passthrough import answer


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = {"local": [add]}


def request(*messages: Message) -> LlmRequest:
    return LlmRequest(
        agent="test",
        model="passthrough",
        call_index=1,
        instruction=None,
        messages=list(messages),
        tools=[],
    )


def test_echoes_every_trailing_user_message_joined_by_newlines() -> None:
    reply = answer(
        request(
            Message.user("earlier"),
            Message.assistant("said"),
            Message.user("one"),
            Message.user("two\nlines"),
        )
    )
    assert reply.text == "one\ntwo\nlines" and reply.stop_reason == StopReason.END_TURN


def test_fixed_response_answers_from_then_on_until_a_bare_one_clears_it() -> None:
    fixed = Message.user("setup\n***FIXED_RESPONSE  all good ")
    assert answer(request(fixed)).text == "all good"
    later = [fixed, Message.assistant("all good"), Message.user("anything")]
    assert answer(request(*later)).text == "all good"
    # The latest line wins; one without text switches echoing back on, as in fast-agent.
    newer = [*later, Message.assistant("all good"), Message.user("***FIXED_RESPONSE other")]
    assert answer(request(*newer)).text == "other"
    cleared = [*newer, Message.assistant("other"), Message.user("***FIXED_RESPONSE")]
    assert answer(request(*cleared, Message.user("echo me"))).text == "***FIXED_RESPONSE\necho me"
    # Tool results are still answered with their text, and tool calls still asked for.
    results = Message(
        role="user", tool_results={"c1": CallToolResult(content=[TextContent(text="42")])}
    )
    assert answer(request(*later, results)).text == "42"
    call = answer(request(*later, Message.user("***CALL_TOOL local__add {}")))
    assert call.stop_reason == StopReason.TOOL_USE and call.tool_calls


async def test_a_turns_messages_are_all_echoed(harness: HarnessFactory) -> None:
    async with harness(agents={"test": {"model": "passthrough"}}) as h:
        result = await h.run(messages=["first", "second"])
    assert result.final is not None and result.final.text == "first\nsecond"


async def test_fixed_response_lasts_across_turns_and_workers(harness: HarnessFactory) -> None:
    config = {"agents": {"test": {"model": "passthrough", "servers": ["local"]}}}
    async with harness(TOOLS, **config) as h:
        first = await h.run("***FIXED_RESPONSE Certainly.")
    assert first.final is not None and first.final.text == "Certainly."
    # Another worker, which never saw the first turn: the conversation carries the response.
    async with harness(TOOLS, **config) as h:
        second = await h.run("What is 6*7?", history=first.history)
        third = await h.run('***CALL_TOOL local__add {"a": 40, "b": 2}', history=second.history)
    assert second.final is not None and second.final.text == "Certainly."
    assert third.final is not None and third.final.text == "42"  # tool results come first


async def test_tool_use_without_calls_loops_until_the_cap(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path / "s.json", *[{"content": [], "stop_reason": "toolUse"} for _ in range(5)]
    )
    config = {
        "agents": {"test": {"model": "playback", "playback": str(script), "max_iterations": 1}}
    }
    async with harness(**config) as h:
        result = await h.run("go")
    assert result.stop_reason == StopReason.MAX_ITERATIONS
    assert result.iterations == 2
    assert [(m.role, m.stop_reason) for m in result.messages] == [
        ("user", None),
        ("assistant", StopReason.TOOL_USE),
        ("user", None),
        ("assistant", StopReason.MAX_ITERATIONS),
        ("user", None),
    ]
    assert result.messages[2].tool_results == {}
