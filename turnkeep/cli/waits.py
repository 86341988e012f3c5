"""What a waiting call is, in a person's words, and the command that decides it: one
description of a wait for every command that shows one (``run``, ``watch`` and ``chat`` without
a terminal, ``pending``), so each kind names its own command (``approve``, ``answer``,
``submit`` or ``budget``) the same way everywhere.

A call waiting in a child turn (an agent the turn called as a tool) is named with that turn's
id, in the text and in the command: a child numbers its calls as its parent does, so a call id
alone may name two different calls."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from turnkeep.contract.approval import PendingCall


@dataclass(frozen=True)
class Wait:
    """One waiting call, described. ``kind``: what it waits for (``approval``, ``an
    answer``...); ``what``: the call (its id and tool), or what is spent against the budget;
    ``where``: the child turn it waits in ("" for the turn's own); ``command``: what decides
    it, ready to paste."""

    kind: str
    what: str
    where: str
    command: str

    def line(self) -> str:
        """The one line a command prints for the wait when it cannot ask."""
        return f"waiting for {self.kind}: {self.what}{self.where} · decide with: {self.command}"


def describe_wait(turn_id: str, call: PendingCall) -> Wait:
    """``call``, waiting in turn ``turn_id`` (the turn followed or listed; a call of one of
    its child turns says which)."""
    owner = call.turn_id or turn_id
    turn, call_id = shlex.quote(owner), shlex.quote(call.call_id)
    where = (
        "" if call.turn_id is None else f" in child turn {call.turn_id} (agent {call.agent or '?'})"
    )
    if call.kind == "budget":
        return Wait(
            "a budget decision",
            _spent(call),
            where,
            f"turnkeep budget {turn} --raise N | --stop",
        )
    if call.kind == "elicitation":
        asks = f" asks: {call.prompt}" if call.prompt else ""
        return Wait(
            "an answer",
            f"{call.call_id} ({call.name}){asks}",
            where,
            f"turnkeep answer {turn} {call_id} --json '{{...}}' | --decline | --cancel",
        )
    if call.kind == "client_result":
        given = "--json '{...}'" if call.requested_schema else "--text ..."
        return Wait(
            "a client's result",
            f"call {call.call_id} ({call.name})",
            where,
            f"turnkeep submit {turn} {call_id} {given}",
        )
    what = "approval of a sampling request" if call.kind == "sampling" else "approval"
    label = "request" if call.kind == "sampling" else "call"
    return Wait(
        what,
        f"{label} {call.call_id} ({call.name})",
        where,
        f"turnkeep approve {turn} {call_id} [--deny]",
    )


def _spent(call: PendingCall) -> str:
    """What a budget's wait says was spent against what (the turn's own words)."""
    if call.prompt:
        return call.prompt
    args: dict[str, Any] = call.arguments
    unit = args.get("unit", "")
    return f"spent {args.get('spent', '?')} {unit} of {args.get('limit', '?')} {unit}"
