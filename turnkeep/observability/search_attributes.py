"""turnkeep's search attributes on a Temporal namespace: checked when a worker starts,
registered by ``turnkeep setup`` (the embedded dev server registers them itself).

Which attributes there are is defined once, in ``turnkeep.workflows.visibility``. A turn may only
upsert attributes its namespace has (an unknown one fails the workflow task), so a worker
checks at start and ``prepare_turn`` records the answer in the turn's plan: the decision is
then part of the history and replays the same on any worker.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError

from turnkeep.workflows.visibility import SEARCH_ATTRIBUTES

log = logging.getLogger(__name__)

# Name → the type turnkeep needs, as the operator service spells it.
WANTED: dict[str, IndexedValueType.ValueType] = {
    key.name: IndexedValueType.ValueType(key.indexed_value_type.value) for key in SEARCH_ATTRIBUTES
}


def type_name(kind: IndexedValueType.ValueType) -> str:
    """``Keyword`` for INDEXED_VALUE_TYPE_KEYWORD: how Temporal's CLI and UI spell types."""
    return IndexedValueType.Name(kind).removeprefix("INDEXED_VALUE_TYPE_").title().replace("_", "")


@dataclass
class Registration:
    """What the namespace has of turnkeep's search attributes."""

    present: list[str] = field(default_factory=list)  # registered with the right type
    missing: list[str] = field(default_factory=list)
    # Registered with another type than turnkeep's: name → that type.
    conflicting: dict[str, str] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)  # by `register`, now present too


async def registration(client: Client) -> Registration:
    """Compare the namespace's custom search attributes with turnkeep's."""
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    have = response.custom_attributes
    found = Registration()
    for name, kind in WANTED.items():
        if name not in have:
            found.missing.append(name)
        elif have[name] != kind:
            found.conflicting[name] = type_name(have[name])
        else:
            found.present.append(name)
    return found


async def usable_search_attributes(client: Client) -> list[str]:
    """The turnkeep search attributes turns on this worker may upsert. Logs one warning when
    some are missing (or the namespace cannot be asked): turns still run, unfiltered."""
    try:
        found = await registration(client)
    except RPCError as err:
        log.warning(
            "could not list the search attributes of Temporal namespace %r (%s): turns will "
            "not set turnkeep's search attributes (TurnkeepAgent, ...). Run `turnkeep setup` "
            "against this namespace, or check the worker's permissions.",
            client.namespace,
            err.message,
        )
        return []
    unusable = found.missing + [
        f"{name} (registered as {kind}, needs {type_name(WANTED[name])})"
        for name, kind in found.conflicting.items()
    ]
    if unusable:
        log.warning(
            "Temporal namespace %r lacks turnkeep's search attributes %s: turns run, but cannot "
            "be filtered by them (the Web UI and `temporal workflow list --query`). Register "
            "them once with `turnkeep setup`.",
            client.namespace,
            ", ".join(unusable),
        )
    return found.present


# Per client (so per namespace): asked once, by the first turn the client starts.
_PRESENT: weakref.WeakKeyDictionary[Client, list[str]] = weakref.WeakKeyDictionary()


async def present_search_attributes(client: Client) -> list[str]:
    """The turnkeep search attributes the client's namespace has, asked once per client, for
    a client to set at a turn's start. Quietly none when the namespace cannot be asked: the
    turn's workflow then sets them itself, and a worker has warned about what is missing."""
    present = _PRESENT.get(client)
    if present is None:
        try:
            present = (await registration(client)).present
        except RPCError as err:
            log.debug("could not list the search attributes of %r: %s", client.namespace, err)
            present = []
        _PRESENT[client] = present
    return present


class SetupError(RuntimeError):
    """The search attributes could not be registered; the message says what to do."""


async def register(client: Client) -> Registration:
    """Add turnkeep's missing search attributes to the client's namespace. Safe to repeat:
    attributes already there are left alone; one registered with another type is reported in
    ``conflicting`` (Temporal cannot change a type, and turns will not set that one)."""
    try:
        found = await registration(client)
        if found.missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=client.namespace,
                    search_attributes={name: WANTED[name] for name in found.missing},
                )
            )
    except RPCError as err:
        raise SetupError(
            f"could not register search attributes on namespace {client.namespace!r}: "
            f"{err.message}. On Temporal Cloud, add them with `tcld namespace "
            f"search-attributes add` or the Cloud UI instead: "
            + ", ".join(f"{name}={type_name(kind)}" for name, kind in WANTED.items())
        ) from err
    found.added, found.missing = found.missing, []
    found.present += found.added
    return found
