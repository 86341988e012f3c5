"""A server's sampling request, when its config has a person approve it before the turn's model
answers it: approved or denied, nothing else."""

from __future__ import annotations

from turnkeep.contract.messages import Message
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits.server_ask import ServerAsk


class Sampling(ServerAsk):
    kind = "sampling"


def count(state: TurnState, model: str, answer: Message) -> None:
    """Count a model call made for a server's sampling request (under its own model)."""
    state.count_usage(answer, model)
