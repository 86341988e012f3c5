"""What a session's ``rewind`` update takes and answers, and what the session keeps of each
turn so that it can go back to it (``SessionWorkflow.rewind``).

A rewind moves the session's conversation back to where it stood once turn ``to_turn`` had
ended: the next turn sees that conversation, as if the turns after it had not happened. Nothing
is deleted: the rewound turns' workflows stay for the audit, their messages stay in the
session's transcript (followers' indices stay valid), and the session keeps a ``Rewind`` record
saying who rewound it, when, and from which turn to which. Turn numbers keep counting up, so a
turn after a rewind never takes the id of a rewound one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from turnkeep.contract.conversation import ConversationRef

REWIND_UPDATE = "rewind"
REWINDS_QUERY = "rewinds"
# In the refusal of a rewind asked while a turn runs or a message is queued.
REWIND_BUSY = "a rewind would race with it"
# How long a `by` may be (as who decided a wait, or revoked a rule).
_BY_MAX_CHARS = 200


class RewindRequest(BaseModel):
    """The one argument of a session's ``rewind`` update. Any client may send one: the session
    checks it against its own state (``SessionWorkflow``), never trusting the caller's view."""

    model_config = ConfigDict(extra="forbid")

    # The turn to go back to: the conversation as it was once this turn had ended; 0 is the
    # conversation before the session's first turn (empty, or the one a fork started with).
    to_turn: int = Field(ge=0)
    # Who asks, for the audit (a gateway sets its key's name).
    by: str = Field(default="unknown", min_length=1, max_length=_BY_MAX_CHARS)


class Rewind(BaseModel):
    """A rewind of a session, kept for the audit (``SessionState.rewinds``)."""

    to_turn: int
    # The last turn the conversation held before the rewind: turns after ``to_turn`` up to
    # this one were rewound.
    from_turn: int
    by: str
    at: datetime
    # The transcript's length when the session rewound: the rewound turns' messages stay
    # before this index, the next turn's come after it.
    at_message: int
    # Turns the session had started when it rewound: the next turn is number ``turns + 1``.
    turns: int

    def rewound(self, turn: int) -> bool:
        """Whether this rewind took turn ``turn`` out of the conversation."""
        return self.to_turn < turn <= self.from_turn

    def describe(self) -> str:
        return (
            f"rewound from turn {self.from_turn} to turn {self.to_turn} by {self.by} at "
            f"{self.at.isoformat(timespec='seconds')}"
        )


class TurnMark(BaseModel):
    """Where the session stood once a turn had ended: what a rewind to that turn restores.
    Kept per turn in the state each run carries, so it stays small (a reference, two counts)."""

    # The conversation, when it is stored: the history's reference (its ``transcript`` is the
    # turn's own end; a rewind keeps the session's current transcript end instead).
    conversation: ConversationRef | None = None
    # The history's length, when it is not stored (then held whole by the session); None once
    # a later turn compacted it, which leaves nothing of it to go back to.
    history_end: int | None = None
    # How many "always allow" rules the session had: those set after (by rewound turns) are
    # revoked by a rewind.
    rules: int = 0

    @model_serializer(mode="wrap")
    def _short(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None and (k, v) != ("rules", 0)}
        return data


def rewound(rewinds: list[Rewind], turn: int) -> Rewind | None:
    """The rewind that took turn ``turn`` out of the conversation, if one did."""
    return next((r for r in rewinds if r.rewound(turn)), None)
