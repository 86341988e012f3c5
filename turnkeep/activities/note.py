"""``turnkeep_note``: a local activity that does nothing. The workflow runs it only for its
summary (e.g. a model call's outcome, ``llm #3 · sonnet → toolUse(2)``), which the history keeps
in the local activity's MarkerRecorded event and the Web UI shows in the Event History; see
``turnkeep/workflows/visibility.py``."""

from __future__ import annotations

from temporalio import activity

from turnkeep.workflows.visibility import NOTE_ACTIVITY


@activity.defn(name=NOTE_ACTIVITY)
async def note() -> None:
    """Nothing to do: the summary the workflow gave this call is the whole point."""
