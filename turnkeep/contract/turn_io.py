"""What a client sends to start a turn and what it gets back (the documentation's *Using
turnkeep from your own Temporal app*)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from temporalio.exceptions import CancelledError

from turnkeep.contract.approval import AllowRule, DecisionRecord
from turnkeep.contract.compact import Compact
from turnkeep.contract.conversation import (
    ConversationRef,
    Messages,
    Segment,
    stores,
    unexpanded,
)
from turnkeep.contract.messages import Message, StopReason, compact_message

DEFAULT_MAX_ITERATIONS = 199

# The workflow type of a turn (``TurnWorkflow``), for code that starts or lists turns.
WORKFLOW_NAME = "TurnWorkflow"

# The task queue turnkeep's workers poll unless their config's `task_queue` names another.
DEFAULT_TASK_QUEUE = "turnkeep"

# How urgently a turn's work is served: interactive before normal before batch.
TaskPriority = Literal["interactive", "normal", "batch"]


def agent_task_queue(task_queue: str, agent: str) -> str:
    """The task queue the turns and sessions of ``agent`` run on: ``turnkeep.demo`` for agent
    ``demo`` of workers on ``turnkeep``. A worker polls one such queue for each agent in its
    config (besides ``task_queue`` itself), so a turn started there can only reach a worker that
    has its agent, however many workers of different configs share ``task_queue``."""
    return f"{task_queue}.{agent}"


# Names a client or a model hands over (agent, model, tool names) are short in any real
# configuration. A bound keeps a megabyte-long one out of summaries, error texts and histories.
NAME_MAX_CHARS = 200


def _bare_text_is_a_user_message(value: Any) -> Any:
    # `temporal workflow start --input '{"agent": "demo", "messages": ["hi"]}'` should just work.
    return Message.user(value) if isinstance(value, str) else value


InputMessage = Annotated[Message, BeforeValidator(_bare_text_is_a_user_message)]


class TurnOverrides(Compact):
    """Per-turn settings; the worker applies only those the agent's config allows."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, max_length=NAME_MAX_CHARS)
    max_iterations: int | None = Field(default=None, ge=0)
    use_history: bool | None = None
    parallel_tool_calls: bool | None = None
    structured_output: dict[str, Any] | None = None  # a JSON Schema
    temperature: float | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, gt=0)

    def given(self) -> set[str]:
        return {name for name, value in self if value is not None}


class ReplayOf(Compact):
    """What makes a turn a counterfactual replay (``turnkeep.replay_turn``): the finished turn
    whose input it takes and whose recorded tool results answer its calls. The worker reads
    both from the source's own history (``replay_source``), never from the client."""

    model_config = ConfigDict(extra="forbid")

    # The workflow id of the finished turn replayed.
    turn: str = Field(min_length=1, max_length=1000)
    # Run calls that no recorded call matches for real: only for an agent whose config allows
    # it (`replay_live_tools`); otherwise such a call gets an error result.
    live_tools: bool = False
    # A system prompt in place of the agent's: only for an agent that lists `instruction` in
    # its `overrides`.
    instruction: str | None = Field(default=None, max_length=200_000)


class TurnInput(TurnOverrides):
    """Input of ``TurnWorkflow``. Unknown keys are rejected: a turn can name an agent, never a
    command, URL or file; everything the worker may touch comes from its own configuration."""

    agent: str = Field(min_length=1, max_length=NAME_MAX_CHARS)
    messages: list[InputMessage] = Field(min_length=1)
    history: Messages = Field(default_factory=list)
    # Set by a session: `history` came from this stored conversation (the data converter
    # expanded it), and the turn hands its own messages back the same way. Honoured only for
    # a child turn of the session that owns it.
    history_ref: ConversationRef | None = None
    # Set by a session with `history_ref`: the digest of the segment in which it stored
    # `messages` (the data converter expanded them), which the turn's own segment follows.
    messages_segment: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    # How deep in a team of agents this turn is: 0 for a turn a client starts, its parent's + 1
    # for an agent's turn another agent called as a tool. A client setting it only brings the
    # worker's `max_agent_depth` nearer.
    depth: int = Field(default=0, ge=0)
    # A budget for this turn, in the agent's budget unit: at most the agent's (a turn may
    # lower its budget, never raise it).
    budget: BudgetLimit | None = None
    # Set by a session whose agent's budget is per session: what its earlier turns spent (a
    # client setting it only brings the budget nearer).
    session_spent: Spent | None = None
    # A session's "always allow" rules, handed to each of its turns. Honoured only for a child
    # turn of a session (as `history_ref`): a client cannot hand a turn rules of its own.
    allow_rules: list[AllowRule] = Field(default_factory=list)
    # Set for a counterfactual replay of a finished turn: its input (`messages`, `history`)
    # is then the source's, as the worker reads it, whatever the client sent.
    replay_of: ReplayOf | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_session(cls, data: Any) -> Any:
        return unexpanded(data) if isinstance(data, dict) else data

    def overrides(self) -> TurnOverrides:
        return TurnOverrides.model_validate(
            self.model_dump(include=set(TurnOverrides.model_fields))
        )

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """In a payload (a turn's start, in its history and its parent's), the settings left
        at their defaults stay out: reading them back gives the same input."""
        data = handler(self)
        if not isinstance(data, dict) or not isinstance(info.context, dict):
            return data
        for name, default in _TURN_INPUT_DEFAULTS.items():
            if name in data and data[name] == default:
                del data[name]
        for message in (*data.get("messages", ()), *data.get("history", ())):
            if isinstance(message, dict):
                compact_message(message)
        return data


_TURN_INPUT_DEFAULTS: dict[str, Any] = {
    **{name: None for name in TurnOverrides.model_fields},
    "history": [],
    "history_ref": None,
    "messages_segment": None,
    "depth": 0,
    "budget": None,
    "session_spent": None,
    "allow_rules": [],
    "replay_of": None,
}

_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


class Usage(Compact):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    calls: int = 0
    # What the tokens cost in US dollars, by the worker's price table; None: unknown (a model
    # with no price, or a sum with such a part), never zero for want of a price.
    cost_usd: float | None = None

    def __add__(self, other: Usage) -> Usage:
        # A sum with an unknown part is unknown, as fast-agent totals its costs: a known part
        # shown alone would read as the whole. An empty usage (no call) is no part at all.
        costs = [u.cost_usd for u in (self, other) if not u.empty]
        cost = None if None in costs else sum(c for c in costs if c is not None)
        summed = {name: getattr(self, name) + getattr(other, name) for name in _TOKEN_FIELDS}
        return Usage(**summed, calls=self.calls + other.calls, cost_usd=cost)

    @property
    def empty(self) -> bool:
        return not self.calls and not any(getattr(self, name) for name in _TOKEN_FIELDS)

    @property
    def tokens(self) -> int:
        """Every token the calls processed: input, output, cache reads and writes."""
        return sum(getattr(self, name) for name in _TOKEN_FIELDS)


BudgetUnit = Literal["tokens", "usd"]


class BudgetLimit(BaseModel):
    """A budget: ``{"tokens": 200000}`` or ``{"usd": 1.5}``."""

    model_config = ConfigDict(extra="forbid")

    tokens: int | None = Field(default=None, gt=0)
    usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_unit(self) -> BudgetLimit:
        if (self.tokens is None) == (self.usd is None):
            raise ValueError("a budget is either `tokens` or `usd`, not both nor neither")
        return self

    @property
    def unit(self) -> BudgetUnit:
        return "tokens" if self.tokens is not None else "usd"

    @property
    def amount(self) -> float:
        return float(self.tokens if self.tokens is not None else self.usd or 0.0)


class Spent(Compact):
    """What a session's earlier turns spent, handed to its next turn (``session_spent``), and
    how much people raised the session's budget by in them."""

    model_config = ConfigDict(extra="forbid")

    tokens: int = Field(default=0, ge=0)
    usd: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    raised: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    def after(self, usage: dict[str, Usage], raised: float) -> Spent:
        """This, plus a turn's ``usage`` (its priced part, in dollars) and its raises."""
        return Spent(
            tokens=self.tokens + sum(u.tokens for u in usage.values()),
            usd=self.usd + sum(u.cost_usd or 0.0 for u in usage.values()),
            raised=self.raised + raised,
        )


TurnInput.model_rebuild()


class RollbackState(StrEnum):
    """What repairing the conversation did (fast-agent's ``HistoryRollbackState``)."""

    APPENDED_INTERRUPTED_TOOL_RESULT = "appended_interrupted_tool_result"
    APPENDED_COMPLETED_TOOL_RESULT = "appended_completed_tool_result"
    HISTORY_UNCHANGED = "history_unchanged"
    HISTORY_EMPTY = "history_empty"
    HISTORY_DISABLED = "history_disabled"


class HistoryChange(StrEnum):
    """How ``TurnResult.history`` came from the turn's input ``history``: whoever carries the
    conversation on can extend what it has instead of taking the whole list again."""

    APPENDED = "appended"  # the input history, then `messages`
    UNCHANGED = "unchanged"  # the agent does not use history: the input history as it was
    COMPACTED = "compacted"  # a summary replaced the start of the conversation


class TurnResult(BaseModel):
    # None only for a turn cancelled before the model ever answered.
    final: Message | None
    # Everything the turn appended to `history` it was given: an auto-heal message if one was
    # needed, the input messages, then what the loop produced. Watchers index into this list.
    messages: list[Message]
    # The whole conversation after the turn: the next turn's `history`.
    history: list[Message] = Field(default_factory=list)
    history_change: HistoryChange = HistoryChange.APPENDED
    stop_reason: StopReason
    iterations: int
    # Per model; with the usage of the agents it called as tools (and theirs) included.
    usage: dict[str, Usage] = Field(default_factory=dict)
    # Whose part of `usage` was whose, per agent and model: the turn's own agent and each agent
    # it called as a tool, however deep. Empty when it called none (`usage` is all its own).
    usage_by_agent: dict[str, dict[str, Usage]] = Field(default_factory=dict)
    # Set when the conversation was repaired: auto-heal at the start, or a cancellation.
    rollback: RollbackState | None = None
    # The final answer parsed as JSON when the turn asked for structured output.
    structured: Any = None
    # Every approval decision on the turn's tool calls (who, what, when, edits), in order.
    decisions: list[DecisionRecord] = Field(default_factory=list)
    # How much people raised the turn's budget by, in the budget's unit (a session adds it to
    # its own, for a budget per session).
    budget_raised: float = 0.0
    # Whether the turn's budget is its session's (the session hands its next turn what this
    # one spent).
    session_budget: bool = False
    # The "always allow" rules the turn knew: those its session handed it, then those set by
    # its decisions, revoked ones included (with who revoked them).
    allow_rules: list[AllowRule] = Field(default_factory=list)
    # For a session's turn whose messages were stored: the session's conversation after the
    # turn (its `history` is then left empty: the session has it by reference).
    conversation: ConversationRef | None = None

    # The segment that holds `messages`, for a turn started from a stored conversation.
    _segment: Segment | None = PrivateAttr(default=None)
    # The result of a turn another agent called (a team's step, an agent tool's call), which
    # only its parent's workflow code reads.
    _for_parent: bool = PrivateAttr(default=False)

    @model_serializer(mode="wrap")
    def _by_reference(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """In a payload of a converter that stores segments, the turn's messages as a segment
        to store and the conversation by reference; in any other payload, no reference. A
        result for a parent turn is written compactly (``_compact_for_parent``)."""
        by_reference = stores(info) and self._segment is not None and self.conversation is not None
        # Without the history (the whole conversation), which would be dumped only to be
        # left out.
        data = handler(self.model_copy(update={"history": []}) if by_reference else self)
        if not isinstance(data, dict) or not isinstance(info.context, dict):
            return data
        if not stores(info):
            # The segment is not stored: whoever reads this takes the conversation itself.
            data["conversation"] = None
        elif by_reference:
            assert self._segment is not None
            # Recorded once per turn in the turn's history and again in its session's: what
            # the reader can tell from the rest stays out (``_read_compact``).
            data["messages"] = self._segment.marker()
            for name in ("final", "history"):
                del data[name]
            _leave_out_defaults(data)
        if self._for_parent:
            _compact_for_parent(data)
        return data

    @model_validator(mode="before")
    @classmethod
    def _read_compact(cls, data: Any) -> Any:
        """A result written compactly: its final answer is its last assistant message, and
        without a stored conversation or a history of its own, its history is its messages."""
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            return data
        data = dict(data)
        if "final" not in data:
            answers = [
                m for m in data["messages"] if isinstance(m, dict) and m.get("role") == "assistant"
            ]
            data["final"] = answers[-1] if answers else None
        if "history" not in data and data.get("conversation") is None:
            data["history"] = data["messages"]
        return data


def _leave_out_defaults(data: dict[str, Any]) -> None:
    for name in _LEFT_OUT_WHEN_DEFAULT:
        if data.get(name) == _DEFAULTS[name]:
            del data[name]


def _compact_for_parent(data: dict[str, Any]) -> None:
    """A child turn's result as its parent's history records it: what the parent's reader
    (``TurnResult._read_compact``) tells from the rest stays out: the final answer (its last
    assistant message), a history that is its messages (a child starts with none), fields at
    their defaults, and messages' empty fields. A turn a client or a session started keeps
    the full form: it is what a client of any SDK, and an operator in the Web UI, reads."""
    if data.get("conversation") is None:
        data.pop("conversation", None)
        if "history" in data and data["history"] == data["messages"]:
            del data["history"]
    if "final" in data and isinstance(data["messages"], list):
        answers = [m for m in data["messages"] if m["role"] == "assistant"]
        if data["final"] == (answers[-1] if answers else None):
            del data["final"]
    _leave_out_defaults(data)
    for messages in (data.get("messages"), data.get("history")):
        if isinstance(messages, list):
            for message in messages:
                compact_message(message)
    if isinstance(data.get("final"), dict):
        compact_message(data["final"])


# What a compact result leaves out when it holds its default.
_LEFT_OUT_WHEN_DEFAULT = (
    "rollback",
    "structured",
    "decisions",
    "allow_rules",
    "history_change",
    "usage_by_agent",
    "budget_raised",
    "session_budget",
)
_DEFAULTS: dict[str, Any] = {
    "usage_by_agent": {},
    "rollback": None,
    "structured": None,
    "decisions": [],
    "allow_rules": [],
    "history_change": HistoryChange.APPENDED.value,
    "budget_raised": 0.0,
    "session_budget": False,
}


class TurnProgress(BaseModel):
    """How far the turn has got: the ``progress`` query's answer, and the long-poll update
    ``wait_for_messages``'s."""

    count: int  # len(TurnResult.messages) so far
    done: bool


class TurnCancelledError(CancelledError):
    """The turn was cancelled; ``result`` holds the repaired conversation to continue from
    (None for a turn cancelled before it had a plan). Raised by ``TurnHandle.result()`` in a
    client and by ``turnkeep.in_workflow.run_turn`` in a workflow. It is Temporal's cancellation
    error: a cancelled workflow that lets it through ends cancelled, as its turn did (one whose
    turn alone was cancelled, from the Web UI say, fails)."""

    def __init__(self, result: TurnResult | None) -> None:
        super().__init__("the turn was cancelled")
        self.result = result
