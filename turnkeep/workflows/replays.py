"""A counterfactual replay's tool calls, answered from the source turn's record: a call whose
name and arguments match a recorded call gets that call's result and runs nothing; any other
gets an error result saying so, unless the replay runs such calls live (asked for, and allowed
by its agent's config). The record is read once per run by the ``replay_source`` activity, so
answering is a pure function of the history: the same on replay."""

from __future__ import annotations

from turnkeep.contract.activity_io import ToolCallRequest
from turnkeep.contract.messages import CallToolResult
from turnkeep.contract.replay_io import (
    REPLAY_SOURCE,
    RecordedCall,
    ReplaySource,
    ReplaySourceRequest,
    call_key,
)
from turnkeep.contract.turn_io import ReplayOf
from turnkeep.workflows import actions, visibility
from turnkeep.workflows.tool_batch import ToolBatch


async def read_source(agent: str, replay: ReplayOf) -> ReplaySource:
    """The source turn as the worker reads it; raises ``ActivityError`` when it refuses."""
    request = ReplaySourceRequest(agent=agent, replay=replay)
    summary = f"read recorded turn {replay.turn}"
    return await actions.execute(
        REPLAY_SOURCE, request, ReplaySource, visibility.clip(summary), actions.SETUP
    )


class RecordedResults:
    """The source's recorded results by call, handed out in the order the source got them: a
    call made twice with the same arguments gets the first result, then the second; once they
    are used up, the last again."""

    def __init__(self, source_turn: str, calls: list[RecordedCall], *, live: bool) -> None:
        self.source_turn = source_turn
        self.live = live
        self._results: dict[str, list[CallToolResult]] = {}
        for call in calls:
            self._results.setdefault(call.key, []).append(call.result)

    def take(self, call: ToolCallRequest) -> CallToolResult | None:
        results = self._results.get(call_key(call.name, call.arguments))
        if not results:
            return None
        return results.pop(0) if len(results) > 1 else results[0]

    def answer(self, batch: ToolBatch, order: list[str]) -> ToolBatch:
        """``batch`` with every call that has a recorded result answered with it, and (unless
        live) every other one answered with an error; taken in the model's ``order``."""
        answered = dict(batch.answered)
        kept: set[str] = set()
        calls = {c.call_id: c for c in (*batch.to_run, *batch.gated, *batch.client)}
        for call_id in order:
            call = calls.get(call_id)
            if call is None:
                continue
            recorded = self.take(call)
            if recorded is not None:
                answered[call_id] = recorded.model_copy(deep=True)
            elif self.live:
                kept.add(call_id)
            else:
                answered[call_id] = CallToolResult.error(self.unmatched(call))
        return ToolBatch(
            to_run=[c for c in batch.to_run if c.call_id in kept],
            answered=answered,
            gated=[c for c in batch.gated if c.call_id in kept],
            client=[c for c in batch.client if c.call_id in kept],
        )

    def unmatched(self, call: ToolCallRequest) -> str:
        return (
            f"Error: this is a replay of turn {self.source_turn}, whose tools do not run again: "
            f"it made no call of tool '{call.name}' with these arguments, so there is no "
            "recorded result to give. Nothing was run."
        )
