"""A turn that waits only for people leaves its worker's workflow cache (docs/approvals.md).

A person may answer in a minute or in days. Kept in the cache for all that time, a waiting turn
would hold the worker's memory and one of its cache slots, which the turns that are working
need. Left out, it costs the worker nothing: the decision (or the timeout, a cancellation, a
query) comes as a workflow task like any other, and the worker replays the turn from its
history, as it does for any workflow its cache let go.

Workflow code asks through an extern function that the worker's ``CacheRelease`` interceptor
registers (``turnkeep/worker/cache_release.py``). Asking issues no command: the history is the
same either way, and a worker without it (a ``Replayer``) does nothing.
"""

from __future__ import annotations

from temporalio import workflow

# The extern function's name, shared with the worker's side.
LEAVE_CACHE = "turnkeep.leave_cache"


def leave_cache() -> None:
    """Ask this workflow's worker to drop it from its cache once the current workflow task is
    done. Not while replaying: the workflow is being brought back to handle a new event."""
    if not workflow.unsafe.is_replaying():
        _ask()


def leave_cache_after_query() -> None:
    """The same, at the end of a query (never replayed), for a turn that still waits only for
    people: the query brought it back (the worker replayed it to answer). Staying would not
    make the decision faster: measured, one reached a turn a query had brought back no sooner
    than one that replays the turn."""
    _ask()


def _ask() -> None:
    release = workflow.extern_functions().get(LEAVE_CACHE)
    if release is not None:
        info = workflow.info()
        release(info.namespace, info.task_queue, info.run_id)
