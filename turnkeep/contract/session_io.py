"""What crosses the boundary of ``SessionWorkflow``: its start input, what it carries from run
to run, what its updates answer and what it ends with."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from turnkeep.contract.approval import AllowRule
from turnkeep.contract.conversation import ConversationRef, Messages, stores
from turnkeep.contract.messages import Message
from turnkeep.contract.rewind import Rewind, TurnMark
from turnkeep.contract.turn_io import NAME_MAX_CHARS, Spent, TaskPriority, TenantName

SESSION_WORKFLOW_NAME = "SessionWorkflow"

# Turns a session runs before it continues as new (unless Temporal suggests it sooner): each
# turn is a child workflow, a handful of events in the session's own history.
DEFAULT_TURNS_PER_RUN = 50

# What a message sent while a turn runs does: `queue` (the default) waits for that turn to end
# and is answered by the next; `interrupt` cancels the running turn (its conversation repaired
# and kept, as for any cancelled turn) so the next one answers everything queued at once.
NewMessageMode = Literal["queue", "interrupt"]


class ForkOrigin(BaseModel):
    """Where a forked session came from: the session (or turn) it was forked from, and how many
    of that conversation's messages it starts with (``TurnkeepForkOf`` says the same)."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, max_length=1_000)
    at: int = Field(ge=1)


class SessionInput(BaseModel):
    """Input of ``SessionWorkflow``. Any client may start one: it names an agent (which each
    turn's ``prepare_turn`` checks against the worker's configuration) and its own limits,
    never anything the worker would run. A fork also starts with a conversation (messages
    only: no rules, no budget spent, nothing a turn's start would not accept from a client)."""

    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=NAME_MAX_CHARS)
    # Seconds without a message (and no turn running) after which the session closes itself;
    # None: it waits for ever, holding no worker slot meanwhile.
    idle_timeout: float | None = Field(default=None, gt=0)
    # Turns per run before it continues as new (sooner when Temporal suggests it). Bounded:
    # a client's huge number would let one run's history grow to the server's limits.
    turns_per_run: int = Field(default=DEFAULT_TURNS_PER_RUN, ge=1, le=1_000)
    # The agent's `on_new_message`, passed in by whoever opens the session: the workflow
    # cannot read the worker's config. Either mode only affects this session's own turns.
    on_new_message: NewMessageMode = "queue"
    # Each turn's model, where the agent's config allows a turn to choose (``TurnInput.model``).
    model: str | None = Field(default=None, max_length=NAME_MAX_CHARS)
    # Each turn's `priority` and `tenant` (``TurnInput``): a turn may lower its agent's
    # priority, never raise it.
    priority: TaskPriority | None = None
    tenant: TenantName | None = None
    # A fork's origin, and the conversation it starts with: by reference once stored
    # (``conversation``, which must be this session's own: ``fork_prefix``), else its messages.
    fork: ForkOrigin | None = None
    transcript: Messages = Field(default_factory=list)
    conversation: ConversationRef | None = None

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        # A session that is not a fork writes what it wrote before these fields; a fork's
        # stored conversation is written as a reference (the codec expands it for the worker).
        ref = self.conversation if stores(info) else None
        data = handler(self.model_copy(update={"transcript": []}) if ref is not None else self)
        if isinstance(data, dict):
            for name in ("model", "priority", "tenant", "fork", "transcript", "conversation"):
                if not data.get(name):
                    data.pop(name, None)
            if ref is not None:
                data["transcript"] = ref.transcript_marker()
        return data


class _ByReference(BaseModel):
    """A session's conversation, with its history and transcript written by reference in a
    payload of a converter that stores segments (``turnkeep.contract.conversation``)."""

    # The conversation: the next turn's `history` (compacted when a turn compacted it).
    # Kept up to date only while the conversation is not stored (`conversation` is None).
    history: Messages = Field(default_factory=list)
    # Every message of every turn, in order (each turn's `TurnResult.messages`): what
    # followers index into, so indices stay valid across turns and runs.
    transcript: Messages = Field(default_factory=list)
    # Where the conversation is stored, once a turn has stored its messages.
    conversation: ConversationRef | None = None

    # Whether a payload carries the history too: a closed session's result does, for its
    # readers; the state a run carries over does not, as a session whose conversation is
    # stored hands its turns the reference, never the history itself.
    _with_history: ClassVar[bool] = True

    @model_serializer(mode="wrap")
    def _by_reference(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        ref = self.conversation
        by_reference = ref is not None and stores(info)
        # Without the conversation itself, which would be dumped only to be left out.
        data = handler(
            self.model_copy(update={"history": [], "transcript": []}) if by_reference else self
        )
        if isinstance(data, dict) and ref is not None and by_reference:
            if self._with_history:
                data["history"] = ref.history_marker()
            else:
                del data["history"]
            data["transcript"] = ref.transcript_marker()
        return data


class SessionState(_ByReference):
    """What one run of a session hands the next when it continues as new: the conversation by
    reference once it is stored, so a long session's runs stay the same size."""

    _with_history: ClassVar[bool] = False

    # Messages sent but not yet handed to a turn: the next turn's `messages`.
    queued: list[Message] = Field(default_factory=list)
    # By turn number, the transcript's length once that turn had ended: where a follower
    # asking for the messages up to turn <n> stops, whatever turns ended since. Numbers the
    # session skipped, and turns that ended before sessions kept this, are missing.
    turn_ends: dict[int, int] = Field(default_factory=dict)
    turns: int = 0  # turns started so far: the next one is `<session id>/turn-<turns + 1>`
    tokens: int = 0  # input and output tokens of every turn
    closing: bool = False
    # What the turns spent against the agent's budget, once one says the budget is per
    # session: handed to each next turn (`TurnInput.session_spent`).
    spent: Spent | None = None
    # The session's "always allow" rules (set by decisions remembered for the session, in its
    # turns), revoked ones kept (marked) for the audit: the active ones go to each turn.
    allow_rules: list[AllowRule] = Field(default_factory=list)
    # By turn number, where the session stood once that turn had ended: what a rewind to it
    # restores (``turnkeep.contract.rewind``). Turns that ended before sessions kept this are
    # missing (a rewind to them is refused).
    turn_marks: dict[int, TurnMark] = Field(default_factory=dict)
    # The session's rewinds, in order, for the audit.
    rewinds: list[Rewind] = Field(default_factory=list)


class RunningTurn(BaseModel):
    workflow_id: str
    # Index in the session's transcript of the turn's first message.
    start: int


class SessionProgress(BaseModel):
    """Answer of the session's long-poll update ``wait_for_messages``."""

    count: int  # len(transcript): messages of the turns that have ended
    turn: RunningTurn | None  # the turn running now, if any
    turns_ended: int  # turn <n> has ended (and its messages are in the transcript) when n <= this
    closed: bool  # no turn runs, none will: the session is ending


class Sent(BaseModel):
    """Answer of ``send``: the turn that will answer the message (running now, or the next
    one, which starts when the running turn ends)."""

    turn_id: str  # `<session id>/turn-<turn>`
    turn: int
    queued: bool  # whether it waits for the running turn to end


class SessionResult(_ByReference):
    """What a closed session ends with: its conversation, readable without a worker."""

    turns: int
    tokens: int
    turn_ends: dict[int, int] = Field(default_factory=dict)  # as ``SessionState.turn_ends``
    rewinds: list[Rewind] = Field(default_factory=list)  # as ``SessionState.rewinds``
