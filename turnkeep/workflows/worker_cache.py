"""Turns and sessions leave their worker's workflow cache while they wait for people (the
documentation's *Human approval of tool calls* and *Sessions*).

A person may answer in a minute or in days. Kept in the cache for all that time, a waiting
workflow would hold the worker's memory and one of its cache slots, which the workflows at
work need. Left out, it costs the worker nothing: when the next event comes (a decision, a
message, a timeout, a cancellation, a query), the worker replays the workflow from its history
to handle it, as it does for any workflow its cache let go.

- A turn waiting only for people (its other calls have ended) leaves at once (``leave_cache``).
- A session with no message to answer leaves once it has been idle for the worker's
  ``worker.idle_session_cache`` (``leave_cache_when_idle``): a person typing the next line
  finds it still cached. Starting a turn cancels that (``stay_in_cache``).

Workflow code asks through an extern function that the worker's ``CacheRelease`` interceptor
registers (``turnkeep.worker.cache_release``). Asking issues no command: the history is the
same either way, and a worker without it (a ``Replayer``) does nothing. Nothing is asked while
replaying: the workflow is being brought back to handle a new event, and what it does with
that event asks again.
"""

from __future__ import annotations

from typing import Literal

from temporalio import workflow

# The extern function's name, shared with the worker's side.
LEAVE_CACHE = "turnkeep.leave_cache"

# When to leave: once the current workflow task is done; after the worker's idle delay (unless
# asked to stay meanwhile); or not (a pending delayed leave is called off).
When = Literal["now", "idle", "stay"]


def leave_cache() -> None:
    """Leave the worker's cache once the current workflow task is done."""
    _ask("now")


def leave_cache_when_idle() -> None:
    """Leave the worker's cache after its idle delay, unless ``stay_in_cache`` comes first."""
    _ask("idle")


def stay_in_cache() -> None:
    """Call off a ``leave_cache_when_idle``: the workflow has work again."""
    _ask("stay")


def ask_after_query(when: When) -> None:
    """The same at the end of a query (never replayed), for a workflow that still waits: the
    query brought it back (the worker replayed it to answer). Staying would not make the next
    decision faster: measured, one reached a turn a query had brought back no sooner than one
    that replays the turn."""
    _request(when)


def _ask(when: When) -> None:
    if not workflow.unsafe.is_replaying():
        _request(when)


def _request(when: When) -> None:
    release = workflow.extern_functions().get(LEAVE_CACHE)
    if release is not None:
        info = workflow.info()
        release(info.namespace, info.task_queue, info.run_id, when)
