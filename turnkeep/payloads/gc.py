"""Garbage collection of payload storage's ``local`` directory: stored payloads, and the
segments of stored conversations.

``collect`` deletes the payload files that nobody has stored or read for
``payload_storage.retention`` and that no running turn references (``sweep``), and the
segments of every session that is closed and whose segments nobody has written or read for
as long (``sweep_conversations``: a running session keeps all of its segments, however long it
has been idle). Every worker runs it at start and then periodically (``payload_sweeper``), and
so does ``turnkeep gc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.converter import (
    ExternalStorage,
)

from turnkeep.contract.session_io import SESSION_WORKFLOW_NAME
from turnkeep.payloads.conversations import DIRECTORY
from turnkeep.payloads.storage.local import LocalDirectoryDriver
from turnkeep.payloads.storage.sweep import SweepReport, sweep, sweep_conversations
from turnkeep.support.durations import describe_duration
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

log = logging.getLogger(__name__)

# A claim's digest in a reference payload (JSON) as it sits, undecoded, in a history event,
# and the digests of its pieces when it was stored in pieces.
_CLAIMED_DIGEST = re.compile(rb'"hash_value"\s*:\s*"([0-9a-f]{64})"')
_CLAIMED_PIECES = re.compile(rb'"pieces"\s*:\s*"([0-9a-f,]+)"')

# How often a worker sweeps (or every quarter of the retention, if sooner): a sweep is one
# directory listing and a stat per file, and nothing is lost by removing a file an hour late.
SWEEP_EVERY = timedelta(hours=1)


async def collect(
    directory: Path, retention: timedelta, client: Client, *, dry_run: bool = False
) -> SweepReport:
    """``sweep`` ``directory``, sparing every payload that a running turn references, and
    ``sweep_conversations`` its conversations, sparing every running session's."""
    in_use = await running_turn_payloads(client)
    sessions = await running_sessions(client)
    report = await asyncio.to_thread(sweep, directory, retention, keep=in_use, dry_run=dry_run)
    conversations = await asyncio.to_thread(
        sweep_conversations,
        directory / DIRECTORY,
        retention,
        running=sessions,
        dry_run=dry_run,
    )
    report.add(conversations)
    return report


async def running_sessions(client: Client) -> set[str]:
    """The workflow ids of the sessions running now: their next turn may read any segment of
    their conversation."""
    query = f"WorkflowType = '{SESSION_WORKFLOW_NAME}' AND ExecutionStatus = 'Running'"
    return {execution.id async for execution in client.list_workflows(query)}


async def running_turn_payloads(client: Client) -> set[str]:
    """The digests of the stored payloads that running turns' histories reference: a worker
    may replay any of them at any time. Read from the reference payloads as they are in the
    history, without fetching what they point to."""
    digests: set[str] = set()
    query = f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus = 'Running'"
    async for execution in client.list_workflows(query):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            raw = event.SerializeToString()
            digests.update(digest.decode() for digest in _CLAIMED_DIGEST.findall(raw))
            for pieces in _CLAIMED_PIECES.findall(raw):
                digests.update(pieces.decode().split(","))
    return digests


@asynccontextmanager
async def payload_sweeper(
    storage: ExternalStorage | None, retention: timedelta | None, client: Client
) -> AsyncIterator[None]:
    """While inside: ``collect`` in ``storage``'s local directories now and every
    ``SWEEP_EVERY``, in a background task, asking ``client``'s namespace which turns are
    running; first warn if ``retention`` is not longer than the namespace's. Nothing to do for
    S3, for storage off, or with retention off."""
    directories = [
        d.directory
        for d in (storage.drivers if storage else [])
        if isinstance(d, LocalDirectoryDriver)
    ]
    if not directories or retention is None:
        yield
        return
    task = asyncio.create_task(
        _sweep_forever(directories, retention, client), name="turnkeep payload sweep"
    )
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _sweep_forever(directories: Sequence[Path], retention: timedelta, client: Client) -> None:
    await warn_if_shorter_than_namespace(client, retention)
    interval = min(SWEEP_EVERY, retention / 4).total_seconds()
    while True:
        for directory in directories:
            try:
                report = await collect(directory, retention, client)
            except Exception as err:
                # Not knowing which turns run (server unreachable...), delete nothing; and a
                # sweep must never take the worker down.
                log.warning("payload sweep of %s skipped: %s", directory, err)
                continue
            if report.removed:
                log.info(
                    "payload sweep: removed %d file(s), %s bytes, unused for %s, from %s",
                    len(report.removed),
                    f"{report.removed_bytes:,}",
                    describe_duration(retention),
                    directory,
                )
            for error in report.errors:
                log.warning("payload sweep: %s", error)
        await asyncio.sleep(interval)


async def warn_if_shorter_than_namespace(client: Client, retention: timedelta) -> None:
    """Log a warning if payloads would be swept while closed turns' histories, which reference
    them, are still kept. Best effort: a client that may not describe its namespace skips it."""
    try:
        described = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=client.namespace), timeout=timedelta(seconds=10)
        )
    except Exception as err:
        log.debug("cannot compare payload retention with the namespace's: %s", err)
        return
    kept = described.config.workflow_execution_retention_ttl.ToTimedelta()
    if retention <= kept:
        log.warning(
            "payload_storage.retention (%s) is not longer than the retention of namespace %r "
            "(%s): payloads of closed turns may be deleted while their histories are still "
            "kept, and reading those turns will fail. Set it above your longest turn plus %s.",
            describe_duration(retention),
            client.namespace,
            describe_duration(kept),
            describe_duration(kept),
        )
