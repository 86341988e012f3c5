"""TurnWorkflow on a real Temporal dev server: every loop rule of the turn loop (the
documentation's *The turn loop*), end to end, with the offline models (passthrough, playback)
and real MCP tool servers."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HarnessFactory, history_text, write_script
from tests.mcp_servers.launch import STDIO_SCRIPT, http_server
from turnkeep.contract.messages import StopReason
from turnkeep.contract.turn_io import TurnResult

pytestmark = pytest.mark.asyncio

# -- local function tools, served by an in-process FastMCP server ------------------------------

events: list[str] = []


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def explode(reason: str) -> str:
    """Always raises."""
    raise ValueError(reason)


async def step(name: str) -> str:
    """Records when it starts and ends; used to tell parallel from sequential runs."""
    events.append(f"start {name}")
    await asyncio.sleep(0.05)
    events.append(f"end {name}")
    return name


_barrier: asyncio.Barrier | None = None


async def meet(name: str) -> str:
    """Returns only once two calls are inside at the same time (or fails after 10 s)."""
    assert _barrier is not None
    async with asyncio.timeout(10):
        await _barrier.wait()
    return f"{name} met"


LOCAL = {"local": [add, explode, step, meet]}


def agent(**settings: Any) -> dict[str, Any]:
    return {"agents": {"test": {"servers": ["local"], **settings}}}


def calls(*specs: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    """A scripted assistant message asking for tools."""
    return {"tool_calls": {cid: {"name": name, "arguments": args} for cid, name, args in specs}}


def tool_texts(result: TurnResult) -> dict[str, tuple[bool, str]]:
    return {
        cid: (res.is_error, res.text)
        for message in result.messages
        for cid, res in (message.tool_results or {}).items()
    }


# -- the loop ----------------------------------------------------------------------------------


async def test_passthrough_echo_turn(harness: HarnessFactory) -> None:
    async with harness(agents={"test": {"model": "passthrough"}}) as h:
        result = await h.run("hello there")
    assert result.final is not None and result.final.text == "hello there"
    assert result.stop_reason == StopReason.END_TURN
    assert [m.role for m in result.messages] == ["user", "assistant"]
    assert result.history == result.messages
    assert result.iterations == 0
    assert result.usage["passthrough"].calls == 1


async def test_passthrough_tool_loop_with_local_tools(harness: HarnessFactory) -> None:
    async with harness(LOCAL, **agent(model="passthrough")) as h:
        result = await h.run('***CALL_TOOL local__add {"a": 2, "b": 40}')
    assert [m.role for m in result.messages] == ["user", "assistant", "user", "assistant"]
    assert result.messages[1].stop_reason == StopReason.TOOL_USE
    assert tool_texts(result) == {"call_1_1": (False, "42")}
    assert result.final is not None and result.final.text == "42"
    assert result.iterations == 1
    timing = result.messages[2].channel_json("tool_timing")
    assert set(timing) == {"call_1_1"} and timing["call_1_1"]["timing_ms"] >= 0


async def test_multi_iteration_playback_with_history(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path / "script.json",
        calls(("c1", "local__add", {"a": 1, "b": 2})),
        calls(("c2", "local__add", {"a": 3, "b": 4})),
        "The sums are 3 and 7.",
    )
    history = [
        {"role": "user", "content": [{"type": "text", "text": "earlier"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "endTurn",
        },
    ]
    async with harness(LOCAL, **agent(model="playback", playback=str(script))) as h:
        result = await h.run("add things", history=history)
    assert tool_texts(result) == {"c1": (False, "3"), "c2": (False, "7")}
    assert result.final is not None and result.final.text == "The sums are 3 and 7."
    assert result.iterations == 2
    assert [m.text for m in result.history[:3]] == ["earlier", "ok", "add things"]
    assert len(result.history) == 2 + len(result.messages)


async def test_parallel_tool_calls_run_concurrently(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    global _barrier
    _barrier = asyncio.Barrier(2)
    script = write_script(
        tmp_path / "s.json",
        calls(("c1", "local__meet", {"name": "a"}), ("c2", "local__meet", {"name": "b"})),
        "done",
    )
    async with harness(LOCAL, **agent(model="playback", playback=str(script))) as h:
        result = await h.run("go")
    # Each call only returns once the other is running too: proof they overlapped.
    assert tool_texts(result) == {"c1": (False, "a met"), "c2": (False, "b met")}


async def test_sequential_when_parallel_is_off(harness: HarnessFactory, tmp_path: Path) -> None:
    events.clear()
    script = write_script(
        tmp_path / "s.json",
        calls(("c1", "local__step", {"name": "a"}), ("c2", "local__step", {"name": "b"})),
        "done",
    )
    config = agent(model="playback", playback=str(script), overrides=["parallel_tool_calls"])
    async with harness(LOCAL, **config) as h:
        result = await h.run("go", parallel_tool_calls=False)
    assert events == ["start a", "end a", "start b", "end b"]
    assert tool_texts(result) == {"c1": (False, "a"), "c2": (False, "b")}


async def test_unknown_tool_and_raising_tool_become_error_results(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path / "s.json",
        calls(
            ("c1", "local__nope", {}),
            ("c2", "local__explode", {"reason": "boom"}),
            ("c3", "local__add", {"a": 1, "b": 1}),
        ),
        "handled",
    )
    async with harness(LOCAL, **agent(model="playback", playback=str(script))) as h:
        result = await h.run("go")
    texts = tool_texts(result)
    assert texts["c1"] == (
        True,
        "Tool 'local__nope' is not available. Available tools: "
        "local__add, local__explode, local__meet, local__step.",
    )
    assert texts["c2"] == (True, "Error: boom")
    assert texts["c3"] == (False, "2")
    assert result.final is not None and result.final.text == "handled"


async def test_invalid_json_arguments_from_the_model(harness: HarnessFactory) -> None:
    async with harness(LOCAL, **agent(model="passthrough")) as h:
        result = await h.run("***CALL_TOOL local__add {a: 1,")
    ((is_error, text),) = tool_texts(result).values()
    assert is_error and "not a JSON object" in text and "{a: 1," in text
    assert result.stop_reason == StopReason.END_TURN


async def test_invalid_arguments_for_the_schema_are_reported_by_the_tool(
    harness: HarnessFactory,
) -> None:
    async with harness(LOCAL, **agent(model="passthrough")) as h:
        result = await h.run('***CALL_TOOL local__add {"a": "two"}')
    ((is_error, text),) = tool_texts(result).values()
    assert is_error and "a" in text


async def test_max_iterations_cap(harness: HarnessFactory, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        *[calls((f"c{i}", "local__add", {"a": i, "b": 0})) for i in range(10)],
    )
    async with harness(LOCAL, **agent(model="playback", playback=str(script))) as h:
        result = await h.run("loop forever", max_iterations=2)
    assistants = [m for m in result.messages if m.role == "assistant"]
    assert len(assistants) == 3  # a cap of N allows N+1 model calls
    assert result.stop_reason == StopReason.MAX_ITERATIONS
    assert result.final is assistants[-1] or result.final == assistants[-1]
    assert result.final.stop_reason == StopReason.MAX_ITERATIONS
    assert result.messages[-1].tool_results is not None  # no dangling call
    assert result.iterations == 3


async def test_structured_output_deferred_finalization(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path / "s.json",
        calls(("c1", "local__add", {"a": 20, "b": 22})),
        "The answer is 42.",
        '{"answer": 42}',
    )
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    config = agent(model="playback", playback=str(script), overrides=["structured_output"])
    async with harness(LOCAL, **config) as h:
        result = await h.run("what is 20+22?", structured_output=schema)
    assert result.structured == {"answer": 42}
    assert result.messages[-2].text.startswith("Now produce the final answer as structured JSON")
    assert result.stop_reason == StopReason.END_TURN


async def test_provider_failure_ends_the_turn_with_an_error_message(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.json"
    async with harness(
        **{"agents": {"test": {"model": "playback", "playback": str(missing)}}}
    ) as h:
        result = await h.run("hi")
    assert result.stop_reason == StopReason.ERROR
    assert result.final is not None and result.final.stop_reason == StopReason.ERROR
    error = result.final.channels and result.final.channels["error"][0]
    assert error and "cannot read playback script" in error.text  # type: ignore[union-attr]


async def test_use_history_false_ignores_prior_conversation(harness: HarnessFactory) -> None:
    history = [{"role": "user", "content": [{"type": "text", "text": "old"}]}]
    config = {"test": {"model": "passthrough", "overrides": ["use_history"]}}
    async with harness(agents=config) as h:
        result = await h.run("fresh", history=history, use_history=False)
    assert result.final is not None and result.final.text == "fresh"
    assert [m.text for m in result.history] == ["old"]


# -- real MCP servers: stdio subprocess and streamable HTTP ------------------------------------


async def test_tools_from_a_stdio_mcp_server(harness: HarnessFactory, tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    config = {
        "mcp": {
            "servers": {
                "srv": {
                    "command": sys.executable,
                    "args": [str(STDIO_SCRIPT)],
                    "env": {"TURNKEEP_TEST_RECORD": str(record)},
                }
            }
        },
        "agents": {"test": {"model": "passthrough", "servers": ["srv"]}},
    }
    prompt = '***CALL_TOOL srv__record {"tag": "one"}\n***CALL_TOOL srv__add {"a": 1, "b": 2}'
    async with harness(**config) as h:
        result = await h.run(prompt)
    assert tool_texts(result) == {"call_1_1": (False, "one"), "call_1_2": (False, "3")}
    assert record.read_text() == "one\n"  # ran exactly once, in the server process


async def test_tools_from_an_http_mcp_server_with_a_tool_filter(harness: HarnessFactory) -> None:
    async with http_server() as url:
        config = {
            "mcp": {"servers": {"web": {"url": url}}},
            "agents": {
                "test": {
                    "model": "passthrough",
                    "servers": ["web"],
                    "tools": {"web": ["echo", "big"]},
                }
            },
            "max_tool_result_bytes": 20_000,
        }
        prompt = (
            '***CALL_TOOL web__echo {"text": "over http"}\n'
            '***CALL_TOOL web__add {"a": 1, "b": 2}\n'
            '***CALL_TOOL web__big {"n_bytes": 1000000}'
        )
        async with harness(**config) as h:
            result = await h.run(prompt)
    texts = tool_texts(result)
    assert texts["call_1_1"] == (False, "over http")
    # `add` exists on the server but the agent's filter hides it.
    assert texts["call_1_2"] == (
        True,
        "Tool 'web__add' is not available. Available tools: web__big, web__echo.",
    )
    is_error, big = texts["call_1_3"]
    assert not is_error and len(big.encode()) <= 20_000
    assert "[turnkeep: tool result truncated from" in big


async def test_every_message_is_recorded_in_history_once(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    """Model calls read their input by reference: history grows with the conversation, not
    with its square."""
    script = write_script(
        tmp_path / "s.json",
        *[calls((f"c{i}", "local__step", {"name": f"marker-{i}-" + "x" * 2000})) for i in range(5)],
        "finished",
    )
    async with harness(LOCAL, **agent(model="playback", playback=str(script))) as h:
        handle = await h.start("prompt-marker-0f9e")
        result = await handle.result()
        text = history_text(await handle.handle.fetch_history())
    assert result.iterations == 5
    # The first tool exchange was in the conversation for five more model calls than the last
    # one, yet both are recorded equally often: once where they were produced, once where they
    # were used, and in the TurnResult. Copying the conversation into each call would add one
    # copy per later call.
    counts = [text.count(f"marker-{i}-") for i in range(5)]
    assert counts == [counts[-1]] * 5 and counts[-1] > 0
    # The prompt: the input, the Web UI's summary, and the result's messages and history.
    assert text.count("prompt-marker-0f9e") == 4
