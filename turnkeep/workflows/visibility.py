"""What an operator sees of a turn in the Temporal Web UI, and filters turns by (the
documentation's *The Web UI*).

- activity summaries: ``llm #3 · sonnet``, ``tool weather__forecast · call_9f2``,
  ``compact history``, ``hook before_llm_call · audit``; once a model call has answered, its
  outcome ``llm #3 · sonnet → toolUse(2)`` (an activity's own summary is fixed when it is
  scheduled, before its answer exists, so the workflow records the outcome as the summary of
  a timer nobody waits for: ``actions.outcome_timer``);
- the workflow's current details (markdown): iteration, what the turn waits on, last stop
  reason, tokens so far;
- search attributes (``TurnkeepAgent``, ``TurnkeepModel``, ``TurnkeepStatus``,
  ``TurnkeepStopReason``, ``TurnkeepIterations``, ``TurnkeepTokens``, ``TurnkeepCostUsd``).

Only text and values computed from the loop's state live here, no Temporal calls, so all of it
is testable without a server; ``TurnWorkflow.show`` publishes them. The search-attribute
definitions here are the one list the embedded server, ``turnkeep setup``, the worker's
start-up check and the workflow all use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from enum import StrEnum
from typing import Any

from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)

from turnkeep.contract.activity_io import HookPoint, ToolCallRequest
from turnkeep.contract.approval import PendingCall
from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.model_io import LlmRequest
from turnkeep.workflows import pending_calls
from turnkeep.workflows.loop import TurnState

# -- search attributes --------------------------------------------------------------------

AGENT = SearchAttributeKey.for_keyword("TurnkeepAgent")
MODEL = SearchAttributeKey.for_keyword("TurnkeepModel")
STATUS = SearchAttributeKey.for_keyword("TurnkeepStatus")
STOP_REASON = SearchAttributeKey.for_keyword("TurnkeepStopReason")
ITERATIONS = SearchAttributeKey.for_int("TurnkeepIterations")
TOKENS = SearchAttributeKey.for_int("TurnkeepTokens")
COST_USD = SearchAttributeKey.for_float("TurnkeepCostUsd")
# A counterfactual replay's source turn (its workflow id), set by the replay's starter.
REPLAY_OF = SearchAttributeKey.for_keyword("TurnkeepReplayOf")
# A forked session's source and the message it was forked at: `<source id>@<n>` (``fork_of``).
FORK_OF = SearchAttributeKey.for_keyword("TurnkeepForkOf")

SEARCH_ATTRIBUTES: tuple[SearchAttributeKey[Any], ...] = (
    AGENT,
    MODEL,
    STATUS,
    STOP_REASON,
    ITERATIONS,
    TOKENS,
    COST_USD,
    REPLAY_OF,
    FORK_OF,
)


def search_attribute_types() -> dict[str, str]:
    """Name → type as Temporal's CLI spells it (``temporal server start-dev
    --search-attribute TurnkeepAgent=Keyword``)."""
    return {
        key.name: key.indexed_value_type.name.title().replace("_", "") for key in SEARCH_ATTRIBUTES
    }


class TurnStatus(StrEnum):
    """``TurnkeepStatus``: whether the turn is still going, and if not, how it ended. Temporal's
    own ExecutionStatus cannot say this: a turn whose model call failed for good, or that hit
    its iteration cap, still *completes* as a workflow."""

    RUNNING = "Running"
    AWAITING_APPROVAL = "AwaitingApproval"  # running, with tool calls waiting for a person
    COMPLETED = "Completed"  # the model gave its final answer (endTurn, stopSequence)
    STOPPED = "Stopped"  # a limit or the provider ended it early: the stop reason says which
    FAILED = "Failed"  # stop reason `error`: a model call or a hook failed for good
    CANCELLED = "Cancelled"  # cancelled; the conversation was repaired


_COMPLETED = {StopReason.END_TURN, StopReason.STOP_SEQUENCE}


def turn_status(state: TurnState) -> TurnStatus:
    if not state.done:
        # A call waiting in a child turn holds this turn up as much as one of its own.
        return (
            TurnStatus.AWAITING_APPROVAL
            if pending_calls.awaits_decision(state)
            else TurnStatus.RUNNING
        )
    if state.stop_reason == StopReason.CANCELLED:
        return TurnStatus.CANCELLED
    if state.stop_reason == StopReason.ERROR:
        return TurnStatus.FAILED
    if state.stop_reason in _COMPLETED or state.stop_reason is None:
        return TurnStatus.COMPLETED
    return TurnStatus.STOPPED


def tokens(state: TurnState) -> tuple[int, int]:
    """Input and output tokens of the turn so far, over all its models, with those of the
    agents it called as tools."""
    usage = state.total_usage().values()
    return sum(u.input_tokens for u in usage), sum(u.output_tokens for u in usage)


SearchAttributeValues = dict[str, str | int | float | None]


def cost_usd(state: TurnState) -> float | None:
    """What the turn has cost so far in US dollars, with the agents it called as tools; None
    when some of it is unknown (a model with no price)."""
    usage = list(state.total_usage().values())
    if any(u.cost_usd is None for u in usage):
        return None
    return sum(u.cost_usd or 0.0 for u in usage) if usage else None


def search_attribute_values(state: TurnState) -> SearchAttributeValues:
    """What the turn's search attributes should say now; None means not set. The stop reason
    is how the turn *ended*, so it stays unset while the turn runs."""
    return {
        AGENT.name: state.plan.agent,
        MODEL.name: state.plan.model,
        STATUS.name: turn_status(state).value,
        STOP_REASON.name: state.stop_reason.value if state.done and state.stop_reason else None,
        ITERATIONS.name: state.iteration,
        TOKENS.name: sum(tokens(state)),
        COST_USD.name: _rounded(cost_usd(state)),
    }


def _rounded(value: float | None) -> float | None:
    # Sums of float costs differ in their last bits: rounded, an unchanged cost is no update.
    return None if value is None else round(value, 6)


_KEYS: dict[str, SearchAttributeKey[Any]] = {key.name: key for key in SEARCH_ATTRIBUTES}


def starting_values(agent: str) -> SearchAttributeValues:
    """What a turn's search attributes say at its start that its starter already knows: all
    of ``search_attribute_values`` for a new turn but the model, which the worker resolves."""
    return {
        AGENT.name: agent,
        STATUS.name: TurnStatus.RUNNING.value,
        ITERATIONS.name: 0,
        TOKENS.name: 0,
    }


def start_search_attributes(
    agent: str, allowed: Iterable[str], *, fork_of: str | None = None
) -> TypedSearchAttributes:
    """``starting_values`` as a start request sets them (with ``TurnkeepForkOf`` for a fork),
    for the ``allowed`` attributes only (a start naming an unregistered one is refused)."""
    allowed = set(allowed)
    values: SearchAttributeValues = {**starting_values(agent), FORK_OF.name: fork_of}
    return TypedSearchAttributes(
        [
            SearchAttributePair(_KEYS[name], value)
            for name, value in values.items()
            if name in allowed and value is not None
        ]
    )


def fork_of(source: str, at: int) -> str:
    """``TurnkeepForkOf``'s value: the source's id and how many of its messages the fork took
    (``TurnkeepForkOf STARTS_WITH 'session-demo-1@'`` finds a session's forks)."""
    return f"{source}@{at}"


def fork_summary(source: str, at: int, agent: str) -> str:
    """A fork's summary in the Web UI."""
    return clip(f"session with {agent}, forked from {source} at message {at}")


def published_values(attributes: TypedSearchAttributes) -> SearchAttributeValues:
    """turnkeep's attributes among ``attributes`` (a run's, as it started), in the form
    ``search_attribute_values`` gives."""
    return {
        pair.key.name: pair.value
        for pair in attributes
        if pair.key.name in _KEYS and isinstance(pair.value, str | int | float)
    }


def search_attribute_updates(
    values: Mapping[str, str | int | float | None],
    published: Mapping[str, str | int | float | None],
    allowed: Iterable[str],
) -> list[SearchAttributeUpdate[Any]]:
    """The updates that bring ``published`` to ``values``, for the ``allowed`` attributes only
    (those the cluster has: upserting an unregistered one fails the workflow task)."""
    allowed = set(allowed)
    updates: list[SearchAttributeUpdate[Any]] = []
    for name, value in values.items():
        if name not in allowed or name not in _KEYS or published.get(name) == value:
            continue
        key = _KEYS[name]
        updates.append(key.value_unset() if value is None else key.value_set(value))
    return updates


# -- activity summaries -------------------------------------------------------------------

# The server refuses a summary whose payload passes 400 bytes (its default), which would fail
# the workflow task for ever; the payload is JSON with non-ASCII escaped (`·` is 6 bytes), and
# a payload codec may add some more. Tool and hook names come from configuration and MCP
# servers, so nothing else bounds them.
SUMMARY_MAX_JSON_BYTES = 300

_CLAUDE_FAMILY = re.compile(r"(?:^|[./])claude-(?:[\d.-]+-)?(opus|sonnet|haiku)(?:-|$)")


def short_model(model: str) -> str:
    """A model's name as a summary shows it: the Claude family (`sonnet` for
    `anthropic.claude-sonnet-4-5` or `claude-3-5-sonnet-latest`), else the model string as
    configured."""
    found = _CLAUDE_FAMILY.search(model)
    return found.group(1) if found else model


# A turn's summary: its prompt on one line, this many characters at most, whoever starts it.
PROMPT_SUMMARY_CHARS = 120


def prompt_summary(text: str) -> str:
    """The Web UI's one-line summary of a turn: its prompt, shortened (a child turn's is
    recorded twice, in its parent's history and its own)."""
    line = " ".join(text.split())
    if len(line) > PROMPT_SUMMARY_CHARS:
        line = line[: PROMPT_SUMMARY_CHARS - 1] + "…"
    return clip(line)


def replay_summary(source: str, on: str) -> str:
    """A replay's one-line summary: which turn it replays, on what model (or agent)."""
    return clip(f"replay of {source} on {on}")


def clip(text: str, limit: int = SUMMARY_MAX_JSON_BYTES) -> str:
    """``text``, shortened with an ellipsis until its JSON form fits in ``limit`` bytes."""
    # Each character is at least one byte of JSON, inside two quotes: a text (or prefix) with
    # more characters than that cannot fit. Cutting to that first keeps the loop below short
    # whatever the text's length (a model's megabyte-long call id, say).
    fits = limit - 2
    if len(text) <= fits and len(json.dumps(text)) <= limit:
        return text
    text = text[:fits]
    while text and len(json.dumps(text + "…")) > limit:
        text = text[:-1]
    return text + "…"


def prepare_summary(agent: str) -> str:
    return clip(f"prepare agent {agent}")


LIST_TOOLS_SUMMARY = "list tools"
COMPACT_SUMMARY = "compact history"


def llm_summary(call_index: int, model: str) -> str:
    return clip(f"llm #{call_index} · {short_model(model)}")


def outcome(answer: Message) -> str:
    """What a model call came back with: ``toolUse(2)``, ``endTurn``, ``error``… (a failed call
    is an ``error`` message by the time the loop sees it)."""
    reason = answer.stop_reason or StopReason.END_TURN
    if reason == StopReason.TOOL_USE:
        return f"{reason.value}({len(answer.tool_calls or {})})"
    return reason.value


def outcome_summary(request: LlmRequest, answer: Message) -> str:
    head = f"llm #{request.call_index} · {short_model(request.model)}"
    return clip(f"{head} → {outcome(answer)}")


def tool_summary(call: ToolCallRequest) -> str:
    return clip(f"tool {call.name} · {call.call_id}")


def hook_summary(point: HookPoint, hook: str) -> str:
    return clip(f"hook {point.value} · {hook}")


def approval_timeout_summary(call: ToolCallRequest) -> str:
    """The summary of the timer a call awaiting approval is denied at, should nobody decide."""
    return clip(f"approval {call.name} · {call.call_id}")


# -- current details ----------------------------------------------------------------------

# Names listed in "waiting on tools …" before the rest is counted.
_NAMES_SHOWN = 8


def waiting_on_model(request: LlmRequest) -> str:
    return f"waiting on model `{request.model}` (llm #{request.call_index})"


def waiting_on_tools(calls: list[ToolCallRequest]) -> str:
    if not calls:  # every call was answered without running (unknown tool, bad arguments)
        return "answering tool calls that cannot run"
    names = list(dict.fromkeys(call.name for call in calls))
    shown = ", ".join(f"`{name}`" for name in names[:_NAMES_SHOWN])
    more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
    return f"waiting on tools {shown}{more} ({_calls(len(calls))})"


def _calls(count: int) -> str:
    return f"{count} call{'s' if count != 1 else ''}"


def tools_in_progress(
    calls: list[ToolCallRequest], done: Collection[str], awaiting: Collection[str]
) -> str:
    """What a tool batch is doing: the calls still running, by id; those awaiting a person's
    decision are listed apart, under the totals (``details``)."""
    running = [c for c in calls if c.call_id not in done and c.call_id not in awaiting]
    if not running and awaiting:
        return f"waiting on approval ({_calls(len(awaiting))})"
    return waiting_on_tools(running or calls)


def waiting_on_hook(point: HookPoint, hook: str) -> str:
    return f"waiting on hook `{hook}` ({point.value})"


def compacting(model: str) -> str:
    return f"compacting history with model `{model}`"


def answered(answer: Message) -> str:
    return f"model answered `{outcome(answer)}`"


STARTING = "starting"


_ENDED = {
    TurnStatus.RUNNING: "running",
    TurnStatus.AWAITING_APPROVAL: "awaiting approval",
    TurnStatus.COMPLETED: "finished",
    TurnStatus.STOPPED: "stopped early",
    TurnStatus.FAILED: "failed",
    TurnStatus.CANCELLED: "cancelled",
}


def ended(state: TurnState) -> str:
    return _ENDED[turn_status(state)]


def details(state: TurnState, doing: str) -> str:
    """The workflow's current details: a line on where the turn is, and a line of totals."""
    tokens_in, tokens_out = tokens(state)
    where = (
        f"**{state.plan.agent}** · iteration {state.iteration} of {state.plan.max_iterations}"
        f" · {doing}"
    )
    totals = (
        f"model `{state.plan.model}` · model calls: {state.model_calls}"
        # Not "in/out: 16/33": the Web UI's markdown turns digits around a slash into a fraction.
        f" · tokens: {tokens_in:,} in, {tokens_out:,} out"
    )
    if (cost := cost_usd(state)) is not None:
        totals += f" · cost: {format_usd(cost)}"
    totals += _scheduling(state.plan.priority, state.plan.fairness_key)
    if state.stop_reason:
        totals += f" · last stop: `{state.stop_reason.value}`"
    elif state.messages and (last := _last_answer(state.messages)) is not None:
        totals += f" · last stop: `{outcome(last)}`"
    return f"{where}\n\n{totals}{_awaiting(state)}"


def _scheduling(priority: str, tenant: str | None) -> str:
    """A turn's task priority and tenant, for its details: said only when either is set
    (a turn without them reads as before)."""
    said = "" if priority == "normal" else f" · priority: {priority}"
    return said + (f" · tenant: `{tenant}`" if tenant else "")


def _awaiting(state: TurnState) -> str:
    """Which calls wait for a person's decision (in child turns too), and since when: a list
    under the totals; what servers asked during tool calls ("awaiting input") apart."""
    waiting = pending_calls.waiting_calls(state)
    if not waiting:
        return ""
    approvals = [c for c in waiting if c.kind == "approval"]
    inputs = [c for c in waiting if c.kind != "approval"]
    text = ""
    if approvals:
        text += "\n\n**awaiting approval** (`turnkeep approve TURN CALL`):\n\n" + _listed(approvals)
    if inputs:
        text += (
            "\n\n**awaiting input** (`turnkeep answer TURN ID`; "
            "a budget: `turnkeep budget TURN`):\n\n" + _listed(inputs)
        )
    return text


def _listed(calls: list[PendingCall]) -> str:
    lines = [
        f"- `{call.name}` · "
        + (f"call `{call.call_id}`" if call.kind == "approval" else f"{call.kind} `{call.call_id}`")
        + (f" · {clip(call.prompt)}" if call.prompt else "")
        + f"{_in_child(call)} · since {call.since:%Y-%m-%d %H:%M:%S} UTC"
        for call in calls[:_NAMES_SHOWN]
    ]
    more = len(calls) - _NAMES_SHOWN
    if more > 0:
        lines.append(f"- and {more} more")
    return "\n".join(lines)


def format_usd(value: float | None) -> str:
    """``$0.0123``, ``$1.50``; ``unknown`` for a cost with no price."""
    if value is None:
        return "unknown"
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def _in_child(call: PendingCall) -> str:
    if call.turn_id is None:
        return ""
    return f" · agent **{call.agent}** in turn `{call.turn_id}`"


def _last_answer(messages: list[Message]) -> Message | None:
    return next((m for m in reversed(messages) if m.role == "assistant"), None)
