"""The ``recorded`` model: in a counterfactual replay, the answers the source turn's model gave.

Model call *n* of a replay answers with the source turn's *n*-th assistant message, read from
the source's result with the worker's own client, so a replay on ``recorded`` runs no model
and no tool: what it checks is everything else (the agent's config, its tools' names, the loop
itself), offline. That is a regression suite's model where the model is unchanged
(``turnkeep.testing.assert_replays(..., model="recorded")``). A call past the recording, or a
turn that is not a replay, gets an ``error`` answer saying so.

Which turn is the source comes from the replay's own start (``TurnInput.replay_of``), which
the worker has already checked (``replay_source``: a completed turn of one of its agents).
"""

from __future__ import annotations

from collections import OrderedDict

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.converter import WorkflowSerializationContext

from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.turn_io import TurnInput, TurnResult, Usage
from turnkeep.providers.base import ModelProvider, with_usage
from turnkeep.providers.parsed_messages import estimate_tokens
from turnkeep.providers.passthrough import PassthroughProvider

# The recorded answers of the last few sources read, by the replay's workflow id: a replay's
# calls read its source once per worker, not once per call.
_CACHED = 64
_ONLY_A_REPLAY = "the `recorded` model answers only a replay of a recorded turn (turnkeep replay)"


class RecordedProvider(ModelProvider):
    name = "recorded"
    bare = True
    context_window = 200_000

    def __init__(self) -> None:
        self._answers: OrderedDict[str, list[Message] | str] = OrderedDict()

    async def complete(self, request: LlmRequest, model_name: str) -> Message:
        if request.call_index < 1:
            # Not one of the turn's calls (a compaction summary): echo, as passthrough does.
            return await PassthroughProvider().complete(request, model_name)
        replay = activity.info().workflow_id
        answers = await self._recorded(replay) if replay is not None else _ONLY_A_REPLAY
        if isinstance(answers, str):
            reply = _error(answers)
        elif request.call_index > len(answers):
            reply = _error(
                f"the recording has {len(answers)} model answer(s); this replay asked for "
                f"answer {request.call_index}"
            )
        else:
            reply = answers[request.call_index - 1]
        usage = Usage(
            input_tokens=estimate_tokens(request.messages), output_tokens=estimate_tokens([reply])
        )
        return with_usage(reply, usage)

    async def _recorded(self, workflow_id: str) -> list[Message] | str:
        """The source's assistant messages, or why there are none."""
        found = self._answers.get(workflow_id)
        if found is None:
            found = await _read(workflow_id)
            self._answers[workflow_id] = found
            while len(self._answers) > _CACHED:
                self._answers.popitem(last=False)
        return found


async def _read(workflow_id: str) -> list[Message] | str:
    client = activity.client()
    replay = client.get_workflow_handle(workflow_id)
    context = WorkflowSerializationContext(namespace=client.namespace, workflow_id=workflow_id)
    converter = client.data_converter.with_context(context)
    async for event in replay.fetch_history_events():
        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            break
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        [first, *_] = await converter.decode(payloads)
        turn = TurnInput.model_validate(first)
        if turn.replay_of is None:
            break
        source = client.get_workflow_handle(turn.replay_of.turn, result_type=TurnResult)
        result = await source.result()
        return [m for m in result.messages if m.role == "assistant"]
    return _ONLY_A_REPLAY


def _error(why: str) -> Message:
    return Message.assistant(f"recorded model: {why}", StopReason.ERROR)
