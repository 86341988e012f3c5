"""Garbage collection of the ``local`` driver's directory, as files: the payloads nobody has
stored or read for ``payload_storage.retention``, and the segments of closed sessions' stored
conversations. ``turnkeep.payloads.gc`` decides what is still in use (it asks the namespace
which turns and sessions run) and when to sweep; this module only deletes.

Why deleting by age is safe for payloads:

- every store refreshes the file's mtime (content addressing means an old file may be
  referenced anew by a new turn), and so does every read;
- a running turn's payloads are never deleted, however long it runs: the references in its
  history are read first (a worker may replay it from them at any time). This costs one
  history read per running turn per sweep; the histories hold references, not payloads;
- a closed turn's history is kept for the namespace's retention and references payloads
  stored no earlier than the turn started, so a retention longer than the longest turn plus
  the namespace's keeps every payload a kept history may need (workers warn at start if it
  is not even longer than the namespace's). Reading one that is gone anyway raises
  ``PayloadExpiredError``, which says so.

A session's segments go only once it is closed and none of them has been written or read for
the retention: a running session keeps all of them, however long it has been idle (its next
turn reads them).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from turnkeep.payloads.storage.local import SHA256
from turnkeep.payloads.storage.owners import owner_key

# A writer's temporary file left for this long is a crashed write's (a write takes seconds).
_ABANDONED_TEMP = timedelta(hours=1)
_TEMP = re.compile(r"\.[0-9a-f]{16}\..+\.tmp")
# A payload a sweep has renamed aside before deleting it (left behind if the sweep crashed).
_ASIDE = re.compile(r"\.([0-9a-f]{64})\.[0-9a-f]+\.gc")

# What a sweep makes of one file (given its stat): removed (True), kept (False), or not one of
# the sweep's files at all (None: left alone and not counted).
Verdict = Callable[[os.DirEntry[str], os.stat_result], bool | None]


@dataclass
class SweepReport:
    """What one sweep of a payload directory removed (or, in a dry run, would) and kept."""

    directory: Path
    removed: list[Path] = field(default_factory=list)
    removed_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0
    # Old enough to go, but a running turn references them.
    in_use: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, other: SweepReport) -> None:
        """Count ``other``'s files (a subdirectory's sweep) in this report."""
        self.removed += other.removed
        self.removed_bytes += other.removed_bytes
        self.kept += other.kept
        self.kept_bytes += other.kept_bytes
        self.in_use += other.in_use
        self.errors += other.errors


def sweep(
    directory: Path,
    retention: timedelta,
    *,
    keep: Collection[str] = frozenset(),
    dry_run: bool = False,
) -> SweepReport:
    """Delete the payload files in ``directory`` that nobody has stored or read for
    ``retention``, except those named in ``keep`` (digests), and writers' temporary files
    abandoned for an hour; leave anything else there alone.

    Safe beside running workers and other sweeps: an old file is renamed aside first and
    deleted only if it is still old then, so a store or read that refreshed it meanwhile wins
    and the file is put back; a store that finds it gone writes it again."""
    report = SweepReport(Path(directory))
    now = time.time()
    cutoff = now - retention.total_seconds()
    temp_cutoff = now - min(retention, _ABANDONED_TEMP).total_seconds()

    def verdict(entry: os.DirEntry[str], stat: os.stat_result) -> bool | None:
        path = Path(entry.path)
        old = stat.st_mtime < cutoff
        if SHA256.fullmatch(entry.name):
            if old and entry.name in keep:
                report.in_use += 1
            return old and entry.name not in keep and (dry_run or remove_if_old(path, cutoff))
        if aside := _ASIDE.fullmatch(entry.name):
            back = path.with_name(aside[1])
            return old if dry_run else remove_if_old(path, cutoff, put_back=back)
        if _TEMP.fullmatch(entry.name) and stat.st_mtime < temp_cutoff:
            if not dry_run:
                path.unlink()
            return True
        return None

    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return report  # nothing stored yet
    _sweep_files(report, entries, verdict)
    return report


def sweep_conversations(
    directory: Path,
    retention: timedelta,
    *,
    running: Collection[str],
    dry_run: bool = False,
) -> SweepReport:
    """Delete the segments of every session that is not ``running`` (workflow ids) and whose
    segments nobody has written or read for ``retention``; a running session's segments are
    all kept, however long it has been idle (its next turn reads them)."""
    report = SweepReport(directory)
    keep = with_bases(directory, {owner_key(owner) for owner in running})
    cutoff = time.time() - retention.total_seconds()
    try:
        sessions = list(os.scandir(directory))
    except FileNotFoundError:
        return report
    for session in sessions:
        if not session.is_dir(follow_symlinks=False):
            continue
        kept = session.name in keep

        def verdict(entry: os.DirEntry[str], stat: os.stat_result, kept: bool = kept) -> bool:
            old = stat.st_mtime < cutoff
            if old and kept:
                report.in_use += 1
            return (
                old
                and not kept
                and SHA256.fullmatch(entry.name) is not None
                and (dry_run or remove_if_old(Path(entry.path), cutoff))
            )

        _sweep_files(report, list(os.scandir(session.path)), verdict)
        if not dry_run:
            with contextlib.suppress(OSError):
                os.rmdir(session.path)  # only once empty
    return report


# The file in a session's directory that names the sessions its conversation goes on from (a
# fork's source: ``turnkeep.payloads.conversations.BASES``), one directory name a line.
BASES = "forked-from"


def with_bases(directory: Path, keep: set[str]) -> set[str]:
    """``keep`` (sessions' directory names) with every session whose segments a kept one's
    conversation goes on from, and theirs in turn: a running fork reads its source's segments,
    however long ago the source closed."""
    todo = list(keep)
    while todo:
        try:
            lines = (directory / todo.pop() / BASES).read_text().split()
        except OSError:
            continue  # no fork (or unreadable: nothing more to keep)
        for base in lines:
            if base not in keep and re.fullmatch(r"[0-9a-f]{32}", base):
                keep.add(base)
                todo.append(base)
    return keep


def _sweep_files(
    report: SweepReport, entries: Iterable[os.DirEntry[str]], verdict: Verdict
) -> None:
    """Count each file of ``entries`` in ``report`` as ``verdict`` has it removed or kept. A file
    gone meanwhile was another sweep's to count; one that cannot be handled is reported, and
    the sweep goes on."""
    for entry in entries:
        path = Path(entry.path)
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
            gone = verdict(entry, stat)
        except FileNotFoundError:
            continue  # another sweep took it first
        except OSError as err:
            report.errors.append(f"{path}: {err}")
            continue
        if gone is None:
            continue
        if gone:
            report.removed.append(path)
            report.removed_bytes += stat.st_size
        else:
            report.kept += 1
            report.kept_bytes += stat.st_size


def remove_if_old(path: Path, cutoff: float, *, put_back: Path | None = None) -> bool:
    """Delete ``path`` if its mtime is before ``cutoff`` once nobody can refresh it any more;
    otherwise leave it (or, set aside, put it back) under its payload name."""
    if put_back is None:
        put_back = path
        aside = path.with_name(f".{path.name}.{os.urandom(4).hex()}.gc")
        # Atomic: from here a store finds no file and writes a new one; a store or read that
        # refreshed the file before this point shows in the mtime read next.
        os.rename(path, aside)
    else:
        aside = path
    if aside.stat().st_mtime < cutoff:
        aside.unlink()
        return True
    os.replace(aside, put_back)  # in use after all (same bytes as any newer copy)
    return False
