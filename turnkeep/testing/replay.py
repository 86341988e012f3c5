"""The replay check: recorded turn and session histories against the workflow code you run now.

Temporal replays a workflow's history against the current code whenever a worker picks it up
again, so an upgrade of turnkeep (or of your own workflow code) that would schedule different
commands breaks the turns in flight at the time. ``check_replay`` finds that out beforehand,
from histories downloaded from your cluster (``temporal workflow show -w ID -o json``), in the
strict sandbox: it imports all of turnkeep's workflow code inside Temporal's sandbox, so a call
workflow code must not make fails here too.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.converter import ExternalStorage
from temporalio.worker import Replayer

from turnkeep.config.settings import Settings
from turnkeep.worker.replay import replay_plugin
from turnkeep.worker.runner import STRICT_WORKFLOW_RUNNER

HistorySource = WorkflowHistory | str | os.PathLike[str]


class ReplayFailedError(AssertionError):
    """Histories that did not replay, by workflow id (with the run id when it has one)."""

    def __init__(self, failures: dict[str, Exception]) -> None:
        self.failures = failures
        lines = "\n".join(f"- {name}: {err!r}" for name, err in failures.items())
        super().__init__(f"{len(failures)} history(ies) did not replay:\n{lines}")


async def check_replay(
    histories: Iterable[HistorySource],
    *,
    settings: Settings | None = None,
    storage: ExternalStorage | None = None,
    workflows: Sequence[type] = (),
) -> int:
    """Replay every history in ``histories`` on the current code, in the strict sandbox, and
    return how many there were; raise ``ReplayFailedError`` naming each one that did not replay
    (a non-determinism error, a forbidden call), and ``ValueError`` when there were none.

    Each item is a ``WorkflowHistory``, a JSON file of one (as ``temporal workflow show -o
    json`` writes it, named ``<workflow id>.json``: a session's commands name its own id), or
    a directory of such files. ``settings`` are the workers' (their ``encryption`` keys and
    ``payload_storage`` read encrypted and offloaded payloads; ``storage`` replaces the
    latter). ``workflows``: your own workflow classes, for histories of your workflows that run
    turns as children.

    A history in which no workflow task was ever scheduled (a run fetched the moment it
    continued as new, or one whose start is delayed) records nothing the workflow code did:
    it is counted, and not handed to the replayer, which would wait for ever for its first
    task, past any cancellation.
    """
    loaded = [history for source in histories for history in _load(source)]
    if not loaded:
        raise ValueError("no histories to replay")
    tasked = [history for history in loaded if _has_workflow_task(history)]
    if not tasked:
        return len(loaded)
    plugin = replay_plugin(settings, storage=storage, workflow_runner=STRICT_WORKFLOW_RUNNER)
    replayer = Replayer(workflows=list(workflows), plugins=[plugin])
    failures: dict[str, Exception] = {}
    # One result per history, with the history it came from: copies of one run (a recorded
    # history and one edited from it) are told apart, which results keyed by run id cannot.
    async with replayer.workflow_replay_iterator(_each(tasked)) as results:
        async for result in results:
            if result.replay_failure is not None:
                history = result.history
                failures[f"{history.workflow_id} (run {history.run_id})"] = result.replay_failure
    if failures:
        raise ReplayFailedError(failures)
    return len(loaded)


def _load(source: HistorySource) -> list[WorkflowHistory]:
    if isinstance(source, WorkflowHistory):
        return [source]
    path = Path(source)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    return [WorkflowHistory.from_json(f.stem, f.read_text(encoding="utf-8")) for f in files]


def _has_workflow_task(history: WorkflowHistory) -> bool:
    return any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED for e in history.events)


async def _each(histories: list[WorkflowHistory]) -> AsyncIterator[WorkflowHistory]:
    for history in histories:
        yield history
