"""Hooks (the documentation's *The turn loop*): the five hook points, their effects, their error
behaviour, and no extra activity when none is enabled — on the real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from examples.hooks import tool_budget
from tests.conftest import HarnessFactory, make_settings, write_script
from turnkeep.contract.activity_io import HookChange, HookContext, HookPoint
from turnkeep.contract.messages import CallToolResult, Message, StopReason, TextContent
from turnkeep.worker.build import build_worker

pytestmark = pytest.mark.asyncio

ran: list[str] = []  # tool executions
seen: list[HookContext] = []  # hook invocations


def secret() -> str:
    """Returns a secret."""
    ran.append("secret")
    return "the password is hunter2"


def add(a: int, b: int) -> int:
    """Add two integers."""
    ran.append(f"add {a} {b}")
    return a + b


def remember(context: HookContext) -> None:
    seen.append(context)


def note_before_llm(context: HookContext) -> HookChange:
    return HookChange(append=[Message.user("hook says: be brief")])


def stop_after_llm(context: HookContext) -> HookChange:
    return HookChange(stop_reason=StopReason.END_TURN)


def redact_results(context: HookContext) -> HookChange:
    def clean(result: CallToolResult) -> CallToolResult:
        text = result.text.replace("hunter2", "[redacted]")
        return result.model_copy(
            update={"content": [TextContent(text=text)], "structured_content": None}
        )

    last = context.messages[-1]
    redacted = last.model_copy(
        update={"tool_results": {k: clean(v) for k, v in (last.tool_results or {}).items()}}
    )
    return HookChange(replace=[*context.messages[:-1], redacted])


def explode(context: HookContext) -> HookChange:
    raise RuntimeError(f"hook blew up at {context.hook_point}")


HOOKS = {
    "remember": remember,
    "note_before_llm": note_before_llm,
    "stop_after_llm": stop_after_llm,
    "redact_results": redact_results,
    "explode": explode,
}
TOOLS = {"local": [secret, add]}


def agent(hooks: dict[str, list[str]], **settings: Any) -> dict[str, Any]:
    return {
        "agents": {
            "test": {"model": "passthrough", "servers": ["local"], "hooks": hooks, **settings}
        }
    }


def activity_names(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def run(h: Any, prompt: str, **turn: Any) -> tuple[Any, WorkflowHistory]:
    handle = await h.start(prompt, **turn)
    result = await handle.result()
    return result, await handle.handle.fetch_history()


async def test_no_hooks_means_no_hook_activity(harness: HarnessFactory) -> None:
    async with harness(TOOLS, hook_functions=HOOKS, **agent({})) as h:
        _, history = await run(h, '***CALL_TOOL local__add {"a": 1, "b": 1}')
    assert "run_hook" not in activity_names(history)


async def test_every_hook_point_sees_the_turn(harness: HarnessFactory) -> None:
    seen.clear()
    points = {point.value: ["remember"] for point in HookPoint}
    async with harness(TOOLS, hook_functions=HOOKS, **agent(points)) as h:
        result, history = await run(h, '***CALL_TOOL local__add {"a": 2, "b": 3}')
    assert [c.hook_point for c in seen] == [
        HookPoint.BEFORE_LLM_CALL,
        HookPoint.AFTER_LLM_CALL,
        HookPoint.BEFORE_TOOL_CALL,
        HookPoint.AFTER_TOOL_CALL,
        HookPoint.BEFORE_LLM_CALL,
        HookPoint.AFTER_LLM_CALL,
        HookPoint.AFTER_TURN_COMPLETE,
    ]
    before_tool = seen[2]
    assert before_tool.last_message is not None and before_tool.last_message.tool_calls
    assert before_tool.iteration == 0 and seen[3].iteration == 1
    assert seen[3].last_message is not None and seen[3].last_message.tool_results
    final = seen[-1]
    assert final.messages == result.messages and final.usage == result.usage
    assert activity_names(history).count("run_hook") == 7


async def test_before_llm_call_appends_what_the_model_then_sees(harness: HarnessFactory) -> None:
    async with harness(
        TOOLS, hook_functions=HOOKS, **agent({"before_llm_call": ["note_before_llm"]})
    ) as h:
        result, _ = await run(h, "hello")
    # passthrough echoes the user messages after the last answer: the prompt and the hook's.
    assert result.final is not None and result.final.text == "hello\nhook says: be brief"
    assert [m.text for m in result.messages] == [
        "hello",
        "hook says: be brief",
        "hello\nhook says: be brief",
    ]


async def test_after_llm_call_can_end_the_turn_and_pending_calls_are_closed(
    harness: HarnessFactory,
) -> None:
    ran.clear()
    async with harness(
        TOOLS, hook_functions=HOOKS, **agent({"after_llm_call": ["stop_after_llm"]})
    ) as h:
        result, _ = await run(h, "***CALL_TOOL local__secret")
    assert ran == []  # the tool never ran
    assert result.stop_reason == StopReason.END_TURN
    closing = result.messages[-1]
    assert closing.tool_results is not None
    (only,) = closing.tool_results.values()
    assert only.is_error and only.text == "Not run: hook 'stop_after_llm' ended the turn."


async def test_after_tool_call_replaces_the_delta(harness: HarnessFactory) -> None:
    async with harness(
        TOOLS, hook_functions=HOOKS, **agent({"after_tool_call": ["redact_results"]})
    ) as h:
        result, _ = await run(h, "***CALL_TOOL local__secret")
    # The model (passthrough answers with the results' text) only ever saw the redacted text.
    assert result.final is not None and result.final.text == "the password is [redacted]"
    assert "hunter2" not in json.dumps([m.model_dump(mode="json") for m in result.history])


async def test_failing_before_tool_call_ends_the_turn_with_an_error(
    harness: HarnessFactory,
) -> None:
    ran.clear()
    async with harness(
        TOOLS, hook_functions=HOOKS, **agent({"before_tool_call": ["explode"]})
    ) as h:
        result, _ = await run(h, "***CALL_TOOL local__secret")
    assert ran == []
    assert result.stop_reason == StopReason.ERROR
    final = result.final
    assert final is not None and final.stop_reason == StopReason.ERROR
    assert "Hook 'explode' (before_tool_call) failed" in final.text
    assert "hook blew up at before_tool_call" in final.text
    # The call that never ran is answered, so the conversation stays valid.
    assert result.messages[-2].tool_results is not None


@pytest.mark.parametrize("point", ["after_tool_call", "after_turn_complete"])
async def test_failing_after_hooks_are_ignored(harness: HarnessFactory, point: str) -> None:
    async with harness(TOOLS, hook_functions=HOOKS, **agent({point: ["explode"]})) as h:
        result, history = await run(h, '***CALL_TOOL local__add {"a": 20, "b": 22}')
    assert result.stop_reason == StopReason.END_TURN
    assert result.final is not None and result.final.text == "42"
    assert "run_hook" in activity_names(history)  # it did run, and failed


async def test_example_hooks_from_config(harness: HarnessFactory, tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    script = write_script(
        tmp_path / "s.json",
        *[
            {"tool_calls": {f"c{i}": {"name": "local__add", "arguments": {"a": i, "b": 1}}}}
            for i in range(12)
        ],
    )
    config = {
        "hooks": {"tool_budget": "examples.hooks:tool_budget", "audit": "examples.hooks:audit_log"},
        "agents": {
            "test": {
                "model": "playback",
                "playback": str(script),
                "servers": ["local"],
                "hooks": {"before_tool_call": ["tool_budget"], "after_turn_complete": ["audit"]},
            }
        },
    }
    import os

    os.environ["TURNKEEP_AUDIT_LOG"] = str(log)
    try:
        async with harness(TOOLS, **config) as h:
            result, _ = await run(h, "go")
    finally:
        del os.environ["TURNKEEP_AUDIT_LOG"]
    budget = int(tool_budget.__globals__["MAX_TOOL_CALLS"])
    assert result.stop_reason == StopReason.PAUSE
    assert result.iterations == budget  # the (budget+1)-th call was refused
    assert result.final is not None and "over its budget" in result.final.text
    (line,) = log.read_text().splitlines()
    assert json.loads(line)["stop_reason"] == "pause"


async def test_a_capped_turn_ends_on_its_final_answer_for_after_turn_complete(
    harness: HarnessFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen.clear()
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("TURNKEEP_AUDIT_LOG", str(log))
    config = agent({"after_turn_complete": ["remember", "audit"]}, max_iterations=0)
    config["hooks"] = {"audit": "examples.hooks:audit_log"}
    async with harness(TOOLS, hook_functions=HOOKS, **config) as h:
        result, _ = await run(h, '***CALL_TOOL local__add {"a": 1, "b": 2}')
    assert result.stop_reason == StopReason.MAX_ITERATIONS
    assert result.messages[-1].tool_results  # the last batch's results end the turn...
    (final,) = seen
    # ...but the hook sees the final assistant message, as fast-agent passes it.
    assert final.last_message is not None and final.last_message == result.final
    assert final.last_message.stop_reason == StopReason.MAX_ITERATIONS
    (line,) = log.read_text().splitlines()
    assert json.loads(line)["stop_reason"] == "maxIterations"


async def test_a_worker_refuses_an_agent_naming_an_unknown_hook(
    client: Any, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, **agent({"before_llm_call": ["nope"]}))
    with pytest.raises(ValueError, match=r"enables hook\(s\) \['nope'\]"):
        build_worker(client, settings, function_tools=TOOLS, hooks=HOOKS, task_queue="unused")
