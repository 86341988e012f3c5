"""Loop control without a server: each rule of the turn loop (the documentation's *The turn
loop*) on ``TurnState`` directly."""

from __future__ import annotations

from turnkeep.contract.activity_io import Timeouts, ToolSpec, TurnPlan
from turnkeep.contract.messages import CallToolResult, Message, StopReason, ToolCall
from turnkeep.contract.turn_io import RollbackState, TurnInput
from turnkeep.workflows.loop import STRUCTURED_FINALIZATION_PROMPT, TurnState
from turnkeep.workflows.repair import INTERRUPTED_TEXT

TOOLS = [ToolSpec(name="srv__a"), ToolSpec(name="srv__b")]


def plan(**overrides: object) -> TurnPlan:
    values: dict[str, object] = {
        "agent": "test",
        "model": "passthrough",
        "max_iterations": 199,
        "use_history": True,
        "parallel_tool_calls": True,
        "has_tools": True,
        "llm": Timeouts(start_to_close=10),
        "tools": Timeouts(start_to_close=10),
    }
    values.update(overrides)
    return TurnPlan.model_validate(values)


def start(history: list[Message] | None = None, **overrides: object) -> TurnState:
    turn = TurnInput(agent="test", messages=[Message.user("hi")], history=history or [])
    state = TurnState.start(turn, plan(**overrides))
    state.tools = TOOLS
    return state


def tool_use(*calls: tuple[str, str], text: str = "") -> Message:
    message = Message.assistant(text, StopReason.TOOL_USE)
    message.tool_calls = {cid: ToolCall(name=name) for cid, name in calls}
    return message


def ok(text: str) -> CallToolResult:
    return CallToolResult.model_validate({"content": [{"type": "text", "text": text}]})


def test_only_tool_use_continues_the_loop() -> None:
    for reason in StopReason:
        state = start()
        answer = tool_use(("c1", "srv__a"))
        answer.stop_reason = reason
        state.on_assistant(answer)
        assert state.awaiting_tools is (reason == StopReason.TOOL_USE)
        assert state.done is (reason != StopReason.TOOL_USE)


def test_tool_use_without_calls_continues_like_fast_agent_and_is_capped() -> None:
    state = start(max_iterations=1)
    calls = 0
    while not state.done:
        state.model_request()
        calls += 1
        state.on_assistant(Message.assistant("hmm", StopReason.TOOL_USE))
        assert state.awaiting_tools
        batch = state.tool_batch()
        assert batch.to_run == [] and batch.answered == {}
        # No tool row tells this outcome in the Web UI: it gets a row of its own.
        assert not state.runs_every_pending_call()
        state.on_tool_results({}, {})
        # fast-agent's answer to it: an empty results message, and the iteration counts.
        assert state.messages[-1] == Message(role="user", tool_results={})
    assert calls == 2 and state.iteration == 2
    assert state.stop_reason == StopReason.MAX_ITERATIONS
    final = state.result().final
    assert final is not None and final.stop_reason == StopReason.MAX_ITERATIONS
    # A hook ending such a turn has no call to answer as not run.
    stopped = start()
    stopped.on_assistant(Message.assistant("hmm", StopReason.TOOL_USE))
    assert stopped.awaiting_tools
    stopped.fail("a hook failed")
    assert [m.role for m in stopped.messages] == ["user", "assistant", "assistant"]


def test_unknown_tool_is_answered_and_the_others_still_run() -> None:
    state = start()
    state.on_assistant(tool_use(("c1", "srv__a"), ("c2", "nope"), ("c3", "srv__b")))
    batch = state.tool_batch()
    assert [c.call_id for c in batch.to_run] == ["c1", "c3"]
    assert batch.answered["c2"].is_error
    assert batch.answered["c2"].text == (
        "Tool 'nope' is not available. Available tools: srv__a, srv__b."
    )


def test_unknown_tool_when_the_agent_has_no_tools_says_so_as_fast_agent_does() -> None:
    state = start()
    state.tools = []
    state.on_assistant(tool_use(("c1", "nope")))
    assert state.tool_batch().answered["c1"].text == (
        "Tool 'nope' is not available. No tools are currently available."
    )


def test_invalid_arguments_are_answered_without_running_the_tool() -> None:
    state = start()
    message = tool_use(("c1", "srv__a"))
    message.tool_calls = {"c1": ToolCall(name="srv__a", invalid_arguments="{not json")}
    state.on_assistant(message)
    batch = state.tool_batch()
    assert batch.to_run == []
    assert batch.answered["c1"].is_error
    assert "{not json" in batch.answered["c1"].text


def test_whether_every_pending_call_runs() -> None:
    """What decides whether a toolUse outcome needs a row of its own in the Web UI."""
    runs = start()
    runs.on_assistant(tool_use(("c1", "srv__a"), ("c2", "srv__b")))
    assert runs.runs_every_pending_call()
    unknown = start()
    unknown.on_assistant(tool_use(("c1", "srv__a"), ("c2", "nope")))
    assert not unknown.runs_every_pending_call()
    invalid = start()
    message = tool_use(("c1", "srv__a"))
    message.tool_calls = {"c1": ToolCall(name="srv__a", invalid_arguments="{not json")}
    invalid.on_assistant(message)
    assert not invalid.runs_every_pending_call()
    answered = start()
    answered.on_assistant(Message.assistant("done", StopReason.END_TURN))
    assert not answered.runs_every_pending_call()


def test_results_come_back_in_call_order_with_timing() -> None:
    state = start()
    state.on_assistant(tool_use(("c1", "srv__a"), ("c2", "srv__b")))
    state.on_tool_results({"c2": ok("two"), "c1": ok("one")}, {"c1": 1.5, "c2": 2.25})
    results = state.messages[-1]
    assert results.role == "user"
    assert list(results.tool_results or {}) == ["c1", "c2"]
    assert results.channel_json("tool_timing") == {
        "c1": {"timing_ms": 1.5},
        "c2": {"timing_ms": 2.25},
    }
    assert state.iteration == 1 and not state.done


def test_cap_of_n_allows_n_plus_one_model_calls_and_leaves_no_dangling_call() -> None:
    state = start(max_iterations=2)
    calls = 0
    # Every message object as first seen: none may change in place later (model calls dump
    # each message once per turn, model_io.MessageJson).
    seen: dict[int, tuple[Message, str]] = {}

    def look() -> None:
        for message in state.messages:
            seen.setdefault(id(message), (message, message.model_dump_json()))

    while not state.done:
        state.model_request()
        calls += 1
        state.on_assistant(tool_use((f"c{calls}", "srv__a")))
        look()
        state.on_tool_results({f"c{calls}": ok("r")}, {f"c{calls}": 0})
        look()
    assert calls == 3
    assert all(message.model_dump_json() == first for message, first in seen.values())
    assert state.stop_reason == StopReason.MAX_ITERATIONS
    result = state.result()
    assert result.final is not None and result.final.stop_reason == StopReason.MAX_ITERATIONS
    assert result.history[-1].tool_results is not None  # the last batch's results are kept


def test_structured_output_is_deferred_until_the_model_stops_then_asked_without_tools() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    state = start(structured_output=schema)
    first = state.model_request()
    assert first.tools == TOOLS and first.structured_output is None
    state.on_assistant(Message.assistant("thinking done"))
    assert not state.done and state.finalizing
    assert state.messages[-1].text == STRUCTURED_FINALIZATION_PROMPT
    final_request = state.model_request()
    assert final_request.tools == [] and final_request.structured_output == schema
    state.on_assistant(Message.assistant('{"x": 3}'))
    assert state.done
    assert state.result().structured == {"x": 3}


def test_structured_output_without_tools_is_asked_for_directly() -> None:
    state = start(structured_output={"type": "object"}, has_tools=False)
    state.tools = []
    assert state.model_request().structured_output == {"type": "object"}
    state.on_assistant(Message.assistant("{}"))
    assert state.done and state.model_calls == 1


def test_use_history_false_sends_only_this_turns_delta() -> None:
    prior = [Message.user("old"), Message.assistant("older answer")]
    state = start(history=prior, use_history=False)
    assert [m.text for m in state.model_request().messages] == ["hi"]
    state.on_assistant(Message.assistant("new"))
    assert state.result().history == prior  # the conversation is not extended


def test_use_history_true_sends_history_then_delta() -> None:
    prior = [Message.user("old"), Message.assistant("older answer")]
    state = start(history=prior)
    assert [m.text for m in state.model_request().messages] == ["old", "older answer", "hi"]


def test_auto_heal_closes_a_dangling_history_first() -> None:
    prior = [Message.user("go"), tool_use(("c1", "srv__a"), ("c2", "srv__b"))]
    state = start(history=prior)
    heal = state.messages[0]
    assert heal.tool_results is not None
    assert {cid: (r.is_error, r.text) for cid, r in heal.tool_results.items()} == {
        "c1": (True, INTERRUPTED_TEXT),
        "c2": (True, INTERRUPTED_TEXT),
    }
    assert state.messages[1].text == "hi"
    assert state.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT


def test_auto_heal_leaves_calls_the_new_messages_answer_to_them() -> None:
    prior = [Message.user("go"), tool_use(("c1", "srv__a"))]
    answer = Message(role="user", tool_results={"c1": ok("done after all")})
    turn = TurnInput(agent="test", messages=[answer], history=prior)
    state = TurnState.start(turn, plan())
    assert state.messages == [answer]  # no second, contradictory result for c1
    assert state.rollback is None
    assert state.model_request().messages == [*prior, answer]


def test_auto_heal_closes_a_dangling_call_at_the_end_of_the_new_messages() -> None:
    for use_history in (True, False):
        request = tool_use(("c9", "srv__a"))
        turn = TurnInput(agent="test", messages=[Message.user("go"), request])
        state = TurnState.start(turn, plan(use_history=use_history))
        heal = state.messages[-1]
        assert state.messages[:-1] == [Message.user("go"), request]
        assert heal.tool_results is not None
        assert {cid: (r.is_error, r.text) for cid, r in heal.tool_results.items()} == {
            "c9": (True, INTERRUPTED_TEXT)
        }
        assert state.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
        assert state.model_request().messages[-1] == heal


def test_hooks_after_the_answer_see_the_final_assistant_message_of_a_capped_turn() -> None:
    from turnkeep.contract.activity_io import HookPoint

    state = start(max_iterations=0)
    state.on_assistant(tool_use(("c1", "srv__a")))
    state.on_tool_results({"c1": ok("r")}, {"c1": 0})
    assert state.stop_reason == StopReason.MAX_ITERATIONS
    for point in (HookPoint.AFTER_LLM_CALL, HookPoint.AFTER_TURN_COMPLETE):
        last = state.hook_context(point).last_message
        assert last is not None and last == state.result().final
        assert last.stop_reason == StopReason.MAX_ITERATIONS
    # after_tool_call still gets the results, as fast-agent hands it the tool message.
    assert state.hook_context(HookPoint.AFTER_TOOL_CALL).last_message == state.messages[-1]


def test_after_llm_call_sees_the_answer_not_the_structured_output_prompt() -> None:
    from turnkeep.contract.activity_io import HookPoint

    state = start(structured_output={"type": "object"})
    answer = Message.assistant("thinking done")
    state.on_assistant(answer)
    assert state.messages[-1].text == STRUCTURED_FINALIZATION_PROMPT
    assert state.hook_context(HookPoint.AFTER_LLM_CALL).last_message == answer


def test_cancel_keeps_completed_results_and_marks_the_rest_interrupted() -> None:
    state = start()
    state.on_assistant(tool_use(("c1", "srv__a"), ("c2", "srv__b")))
    state.cancel(completed={"c1": ok("done")})
    repair = state.messages[-1]
    assert repair.tool_results is not None
    assert repair.tool_results["c1"].text == "done" and not repair.tool_results["c1"].is_error
    assert repair.tool_results["c2"].text == INTERRUPTED_TEXT and repair.tool_results["c2"].is_error
    assert state.rollback == RollbackState.APPENDED_INTERRUPTED_TOOL_RESULT
    assert state.stop_reason == StopReason.CANCELLED


def test_cancel_rollback_states() -> None:
    all_done = start()
    all_done.on_assistant(tool_use(("c1", "srv__a")))
    all_done.cancel(completed={"c1": ok("done")})
    assert all_done.rollback == RollbackState.APPENDED_COMPLETED_TOOL_RESULT

    waiting_on_model = start()
    waiting_on_model.cancel(completed={})
    assert waiting_on_model.rollback == RollbackState.HISTORY_UNCHANGED
    assert len(waiting_on_model.messages) == 1

    disabled = start(use_history=False)
    disabled.on_assistant(tool_use(("c1", "srv__a")))
    disabled.cancel(completed={})
    assert disabled.rollback == RollbackState.HISTORY_DISABLED


def test_usage_is_summed_per_model() -> None:
    from turnkeep.contract.turn_io import Usage
    from turnkeep.providers.base import with_usage

    state = start()
    state.on_assistant(
        with_usage(tool_use(("c1", "srv__a")), Usage(input_tokens=10, output_tokens=2))
    )
    state.on_tool_results({"c1": ok("r")}, {"c1": 0})
    state.on_assistant(
        with_usage(Message.assistant("end"), Usage(input_tokens=30, output_tokens=5))
    )
    assert state.result().usage["passthrough"] == Usage(input_tokens=40, output_tokens=7, calls=2)


def test_repeated_compaction_keeps_the_tail_and_maps_back_onto_the_full_record() -> None:
    from turnkeep.contract.activity_io import CompactionPlan
    from turnkeep.workflows.loop import SUMMARY_PREFIX

    state = start(compaction=CompactionPlan(threshold_tokens=1, keep_exchanges=0))
    assert state.compaction_cut() is None  # before any model call: never
    for n in range(1, 4):
        state.on_assistant(tool_use((f"c{n}", "srv__a")))
        state.on_tool_results({f"c{n}": ok(f"r{n}")}, {f"c{n}": 0})
        cut = state.compaction_cut()
        if n == 1:
            assert cut is None  # only the pending exchange: nothing to summarise
            continue
        assert cut is not None
        state.on_compacted(cut, f"summary {n}")
        conversation = state.conversation()
        assert conversation[0].text == SUMMARY_PREFIX + f"summary {n}"
        # The pending exchange (the last assistant call and its results) is kept verbatim.
        assert conversation[1:] == state.messages[-2:]
    assert len(state.messages) == 7  # the turn's record is never shortened
    assert state.result().history == state.conversation()


def test_compaction_is_not_tried_again_after_a_failure() -> None:
    from turnkeep.contract.activity_io import CompactionPlan

    state = start(compaction=CompactionPlan(threshold_tokens=1, keep_exchanges=0))
    for n in range(1, 3):
        state.on_assistant(tool_use((f"c{n}", "srv__a")))
        state.on_tool_results({f"c{n}": ok("r")}, {f"c{n}": 0})
    assert state.compaction_cut() is not None
    state.compaction_failed = True
    assert state.compaction_cut() is None


def test_tool_calls_in_the_final_structured_answer_are_answered_not_run() -> None:
    state = start(structured_output={"type": "object"})
    state.on_assistant(Message.assistant("thinking done"))
    state.on_assistant(tool_use(("c1", "srv__a")))
    assert state.done and not state.awaiting_tools
    closing = state.messages[-1]
    assert closing.tool_results is not None and closing.tool_results["c1"].is_error


def test_model_input_pages_reassemble_to_the_request_and_stay_small() -> None:
    from turnkeep.contract.model_io import MODEL_INPUT_PAGE_BYTES, model_input_page, request_digest

    state = start()
    for n in range(60):  # ~600 KB of tool results
        state.on_assistant(tool_use((f"c{n}", "srv__a")))
        state.on_tool_results({f"c{n}": ok("r" * 10_000)}, {f"c{n}": 0})
    request = state.model_request()
    first = model_input_page(request, 0)
    pages, messages = [first], list(first.request.messages)
    while len(messages) < first.total_messages:
        pages.append(model_input_page(request, len(messages)))
        messages += pages[-1].request.messages
    assert len(pages) > 2
    assert all(len(p.model_dump_json()) < MODEL_INPUT_PAGE_BYTES + 20_000 for p in pages)
    assert pages[1].request.tools == [] and first.request.tools == TOOLS
    reassembled = first.request.model_copy(update={"messages": messages})
    assert request_digest(reassembled) == request_digest(request)
