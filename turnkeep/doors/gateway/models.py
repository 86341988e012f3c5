"""The gateway's HTTP API as pydantic models: what every request is validated against, what
every answer is built from, and what the OpenAPI document describes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from turnkeep.contract.approval import Decision, PendingCall, RememberScope, SubmittedResult
from turnkeep.contract.messages import Message
from turnkeep.contract.turn_io import TaskPriority, TurnResult

# An agent's name as a request may give it; longer is no agent's.
_NAME_CHARS = 200
# The largest message index a stream may start after (`?after=`, `Last-Event-ID`): a 64-bit
# integer, as JSON clients hold one.
MAX_INDEX = 2**63 - 1
_PRIORITY = (
    "How soon its work is served when workers are busy: interactive, normal or batch. It "
    "lowers the agent's and the key's priority, never raises them. The tenant (fairness key) "
    "is always the key's."
)


class _Request(BaseModel):
    # A key the API does not have is a mistake worth naming, not something to ignore.
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: one line naming the problem."""

    error: str


class AgentInfo(BaseModel):
    name: str
    description: str | None = None


class AgentList(BaseModel):
    agents: list[AgentInfo]


class StartTurn(_Request):
    agent: str = Field(min_length=1, max_length=_NAME_CHARS)
    prompt: str = Field(min_length=1)
    priority: TaskPriority | None = Field(default=None, description=_PRIORITY)


class TurnStarted(BaseModel):
    turn_id: str
    web_ui: str | None = None


TurnStatusName = Literal["running", "completed", "failed", "cancelled", "terminated", "timed_out"]


class TurnState(BaseModel):
    turn_id: str
    status: TurnStatusName
    result: TurnResult | None = None
    error: str | None = None


class TurnRef(BaseModel):
    turn_id: str


class Approval(PendingCall):
    """A call waiting for a decision. ``turn_id`` is the turn to send the decision to (the
    one listed; a call waiting in a child turn is decided through its parent, which passes
    the decision down); ``child_turn_id`` is the child turn it waits in, if any."""

    turn_id: str  # always set here: where to decide it
    child_turn_id: str | None = None


class ApprovalList(BaseModel):
    approvals: list[Approval]


class DecideCall(_Request):
    """A decision on what waits, in the ``decide`` update's terms: ``approve`` or deny, and
    what goes with it for each kind of wait (``PendingCall.kind``): ``arguments`` (an edit)
    and ``remember`` for a tool call's approval; ``content`` (or ``cancel``, with a denial) for
    an elicitation; ``result`` for a client-side tool's call; ``limit`` for a budget."""

    approve: bool
    reason: str | None = Field(default=None, max_length=2000)
    arguments: dict[str, Any] | None = None
    remember: RememberScope | None = None
    remember_arguments: bool = False
    content: dict[str, Any] | None = None
    cancel: bool = False
    result: SubmittedResult | None = None
    limit: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    def decision(self, call_id: str, by: str) -> Decision:
        return Decision(
            call_id=call_id,
            decision="approve" if self.approve else "deny",
            by=by,
            **self.model_dump(exclude={"approve"}, exclude_unset=True),
        )


class OpenSession(_Request):
    agent: str = Field(min_length=1, max_length=_NAME_CHARS)
    priority: TaskPriority | None = Field(default=None, description=_PRIORITY)


class SessionOpened(BaseModel):
    session_id: str


class SessionState(BaseModel):
    session_id: str
    agent: str
    open: bool
    messages: list[Message]


class SendMessage(_Request):
    text: str = Field(min_length=1)


class MessageSent(BaseModel):
    turn: int
    turn_id: str
    web_ui: str | None = None


class SessionRef(BaseModel):
    session_id: str


def _whole_float_as_int(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer as JSON Schema counts one: `3.0` is the integer 3 (the document says `integer`), which
# the strict reading of a request body would otherwise refuse.
WholeNumber = Annotated[int, BeforeValidator(_whole_float_as_int)]


class RewindSession(_Request):
    # The turn to go back to: the conversation as it was once it had ended (0: empty).
    to_turn: WholeNumber = Field(ge=0, le=MAX_INDEX)
    # Cancel the running turn first (its conversation repaired), rather than be refused.
    cancel_running: bool = False


class Fork(_Request):
    """A new session from a turn's or a session's first ``at`` messages (counted from 1, as
    ``turnkeep show`` prints them), with ``agent`` (default: the source's) and ``model`` for
    its turns, then ``text`` sent to it if given."""

    at: WholeNumber = Field(ge=1, le=MAX_INDEX)
    agent: str | None = Field(default=None, min_length=1, max_length=_NAME_CHARS)
    model: str | None = Field(default=None, min_length=1, max_length=_NAME_CHARS)
    text: str | None = Field(default=None, min_length=1)


class Forked(BaseModel):
    session_id: str
    fork_of: str  # `<source id>@<at>`, as its `TurnkeepForkOf` search attribute
    web_ui: str | None = None


# -- server-sent events: each event's `data` ---------------------------------------------------


class MessageData(BaseModel):
    index: int
    message: Message
    turn_id: str | None = None


class TextData(BaseModel):
    text: str
    call_index: int


class ToolCallData(BaseModel):
    name: str
    call_id: str


class RestartedData(BaseModel):
    call_index: int


class ApprovalData(BaseModel):
    turn_id: str
    calls: list[PendingCall]


class EndData(BaseModel):
    status: str
    error: str | None = None
