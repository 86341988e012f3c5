"""Large payloads outside the workflow history: Temporal's external payload storage.

Temporal refuses any payload over 2 MB (a workflow task that tries to record one fails and is
retried for ever) and warns long before that. With external storage, the data converter writes
every payload of at least ``payload_storage.threshold_bytes`` to a storage driver and records
only a small reference in the history; whoever decodes the reference — a worker replaying the
turn, a client reading its result — fetches the payload back through the same driver.

Drivers:

- ``local`` (the default): ``LocalDirectoryDriver``, one file per payload in a directory, named
  by the SHA-256 of its bytes. Client and workers must see the same directory: one machine, or a
  shared filesystem.
- ``s3``: the SDK's ``S3StorageDriver`` (``pip install "temporalio[aioboto3]"``), credentials
  and region from the usual AWS environment.
- ``off``: payloads stay inline.

Garbage collection (``local`` only): ``collect`` deletes the payload files that nobody has
stored or read for ``payload_storage.retention`` and that no running turn references; every
worker runs it at start and then periodically (``payload_sweeper``), and so does ``turnkeep
gc``. Why that is safe:

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

S3 objects are keyed per workflow run and are never swept here: a bucket lifecycle rule
expires them.

The SDK marks this API experimental; this module is the one place that touches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from turnkeep.config.paths import OWNER_ONLY_DIR_MODE, state_home
from turnkeep.config.settings import PayloadStorageSettings
from turnkeep.observability.recording import payload_bytes_stored

LOCAL_DRIVER_NAME = "turnkeep.local"
S3_DRIVER_NAME = "aws.s3driver"  # the SDK's default, so other SDKs' S3 drivers can read ours
_SHA256 = re.compile(r"[0-9a-f]{64}")

log = logging.getLogger(__name__)


class PayloadStorageError(RuntimeError):
    """A stored payload could not be written or read back."""


class MissingPayloadError(PayloadStorageError):
    """A history references a payload that is not in the storage directory."""


class PayloadExpiredError(MissingPayloadError):
    """A missing payload that was stored longer than ``payload_storage.retention`` ago, so the
    sweep removed it (rather than a misconfigured ``payload_storage.path``)."""


class PayloadStorageConfigError(ValueError):
    """``payload_storage`` names a driver this installation cannot provide."""


def payload_directory(config: PayloadStorageSettings, base_dir: Path | None = None) -> Path:
    """Where the ``local`` driver keeps payloads: ``config.path`` (relative to ``base_dir``,
    the config file's directory, when given), else ``<state dir>/payloads``."""
    if config.path is None:
        path = state_home() / "payloads"
    else:
        # An absolute path stays as it is.
        path = config.path.expanduser() if base_dir is None else base_dir / config.path.expanduser()
    return Path(os.path.abspath(path))


def external_storage(
    config: PayloadStorageSettings, base_dir: Path | None = None
) -> ExternalStorage | None:
    """The ``ExternalStorage`` that ``payload_storage`` describes; ``None`` when it is off.
    ``base_dir``: what a relative ``path`` is relative to (the config file's directory)."""
    driver: StorageDriver
    if config.driver == "off":
        return None
    if config.driver == "local":
        driver = LocalDirectoryDriver(
            payload_directory(config, base_dir), retention=config.retention
        )
    else:
        assert config.bucket  # the settings validator requires it
        driver = s3_driver(config.bucket, config.prefix)
    return ExternalStorage(drivers=[driver], payload_size_threshold=config.threshold_bytes)


def describe_storage(storage: ExternalStorage | None) -> str:
    """Where ``storage`` puts payloads, in words (for errors about mismatched storage)."""
    if storage is None:
        return "no external payload storage"
    where = ", ".join(_location(d) or f"{d.type()} driver {d.name()!r}" for d in storage.drivers)
    return f"{where} (payloads from {storage.payload_size_threshold:,} bytes)"


def same_storage(a: ExternalStorage | None, b: ExternalStorage | None) -> bool:
    """Whether what one writes the other can read: the same object, or drivers built here for
    the same place with the same threshold. Drivers of unknown kinds only match themselves."""
    if a is b:
        return True
    if a is None or b is None or a.payload_size_threshold != b.payload_size_threshold:
        return False
    places_a = [(d.name(), _location(d)) for d in a.drivers]
    places_b = [(d.name(), _location(d)) for d in b.drivers]
    return places_a == places_b and all(place for _, place in places_a)


def _location(driver: StorageDriver) -> str | None:
    location = getattr(driver, "location", None)
    return location if isinstance(location, str) else None


# --- local directory -------------------------------------------------------------------------


class LocalDirectoryDriver(StorageDriver):
    """Payloads as files in one directory, each named by the SHA-256 of its serialized bytes.

    Content-addressed, so storing is idempotent: a retried workflow task or activity, or two
    workers storing the same payload at once, write the same file. A file is written under a
    temporary name, flushed to disk and renamed into place, so a reader never sees half a file.
    Reading checks the digest, so a damaged file is reported rather than decoded.

    Storing an existing file and reading one refresh its mtime, which is what ``sweep`` ages
    files by. ``retention`` (the sweep's) tells a payload that was swept from one that was never
    here: claims carry the time they were stored.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        driver_name: str = LOCAL_DRIVER_NAME,
        retention: timedelta | None = None,
    ) -> None:
        self.directory = Path(os.path.abspath(Path(directory).expanduser()))
        self.retention = retention
        self._name = driver_name

    @property
    def location(self) -> str:
        return f"local directory {self.directory}"

    def name(self) -> str:
        return self._name

    def type(self) -> str:
        return "turnkeep.local-directory"

    def path_for(self, digest: str) -> Path:
        """The file that holds the payload whose serialized bytes have this SHA-256."""
        if not _SHA256.fullmatch(digest):
            # Claims come from workflow histories; never let one name a path of its own.
            raise PayloadStorageError(f"not a SHA-256 hex digest: {digest!r}")
        return self.directory / digest

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        del context  # content addressing needs no workflow identity
        stored_at = datetime.now(UTC).isoformat(timespec="seconds")
        # One payload at a time, serialized in its thread: a turn's payloads may be tens of MB
        # each, and no copy of one should outlive its own write.
        claims = await asyncio.gather(
            *(asyncio.to_thread(self._store_payload, payload) for payload in payloads)
        )
        return [
            StorageDriverClaim(
                claim_data={"hash_algorithm": "sha256", **claim, "stored_at": stored_at}
            )
            for claim in claims
        ]

    def _store_payload(self, payload: Payload) -> dict[str, str]:
        """Write one payload; its claim names the SHA-256 of its bytes and, when it was stored
        in pieces, the pieces' digests in order."""
        data = payload.SerializeToString()
        pieces = split_pieces(data)
        if len(pieces) == 1:
            return {"hash_value": self._write(data)}
        digests = [self._write(piece) for piece in pieces]
        return {"hash_value": hashlib.sha256(data).hexdigest(), "pieces": ",".join(digests)}

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        del context
        return list(
            await asyncio.gather(*(asyncio.to_thread(self._read, c.claim_data) for c in claims))
        )

    def _write(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.path_for(digest)
        with contextlib.suppress(FileNotFoundError):  # swept meanwhile: write it again
            if path.stat().st_size == len(data):
                # Already stored (same bytes: the name is their digest), perhaps long ago by
                # another turn: this new reference restarts its retention.
                os.utime(path)
                return digest
        write_durably(path, data, what="payloads", where="payload_storage.path")
        return digest

    def _read(self, claim: Mapping[str, str]) -> Payload:
        algorithm, digest = claim.get("hash_algorithm"), claim.get("hash_value", "")
        if algorithm != "sha256":
            raise PayloadStorageError(f"unsupported hash algorithm in payload claim: {algorithm!r}")
        path = self.path_for(digest)
        pieces = claim.get("pieces")
        try:
            if pieces:
                paths = [self.path_for(piece) for piece in pieces.split(",")]
                data = b"".join(self._read_file(piece, claim) for piece in paths)
            else:
                data = self._read_file(path, claim)
        except FileNotFoundError:
            raise self._missing(path, claim) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise PayloadStorageError(
                f"externally stored payload {path} is damaged: its contents no longer match "
                "their SHA-256"
            )
        payload = Payload()
        payload.ParseFromString(data)
        return payload

    def _read_file(self, path: Path, claim: Mapping[str, str]) -> bytes:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise self._missing(path, claim) from None
        # Still in use: keep it from the sweep for another retention period. Best effort (a
        # reader may only have read access); after the read, so a sweep that saw the file old
        # and renamed it away meanwhile finds it fresh and puts it back.
        with contextlib.suppress(OSError):
            os.utime(path)
        return data

    def _missing(self, path: Path, claim: Mapping[str, str]) -> MissingPayloadError:
        stored_at = _claim_time(claim)
        age = datetime.now(UTC) - stored_at if stored_at else None
        if age is not None and self.retention is not None and age > self.retention:
            return PayloadExpiredError(
                f"externally stored payload {path} is gone: it was stored "
                f"{describe_duration(age)} ago ({stored_at:%Y-%m-%d %H:%M} UTC), longer than "
                f"payload_storage.retention ({describe_duration(self.retention)}), so the "
                "payload sweep (or `turnkeep gc`) deleted it and what references it can no "
                "longer be read. Keep retention longer than your longest turn plus the "
                "namespace's retention."
            )
        return MissingPayloadError(
            f"externally stored payload {path} is missing: the workflow history references "
            f"it (sha256 {claim.get('hash_value')}) but it is not in {self.directory}, the "
            "directory payload_storage.path names here. Point payload_storage.path at the "
            "directory the worker that wrote it uses (clients and workers must share it), or "
            "restore the file."
        )


# A run of serialized payload at least this long with no `"` in it is stored as a piece of its
# own. Such runs are the insides of long JSON strings (a tool result's text), and a turn writes
# the same text into several payloads: the tool's result, each model call that echoes it, and
# the turn's result (once in `messages`, once in `history`). Stored whole, one large result
# would be on disk several times over; as pieces named by their digest, each text is once.
PIECE_BYTES = 64 * 1024


def split_pieces(data: bytes) -> list[bytes]:
    """``data`` cut around every run of ``PIECE_BYTES`` or more without a double quote; the
    pieces joined are ``data``. The cuts depend on the bytes around them alone, so the same
    long string gives the same piece in whatever payload it sits."""
    # Such a run covers a whole block of half that size at a multiple of it. Where every such
    # block holds a quote (JSON of many short strings: a conversation), there is no cut to
    # make, and checking that stays in C instead of walking every string of the payload.
    half = PIECE_BYTES // 2
    if all(data.find(b'"', i, i + half) != -1 for i in range(0, len(data) - half + 1, half)):
        return [data]
    pieces: list[bytes] = []
    done = offset = 0  # bytes of `data` already in `pieces`; where the next run starts
    for run in data.split(b'"'):
        if len(run) >= PIECE_BYTES:
            if offset > done:
                pieces.append(data[done:offset])
            pieces.append(run)
            done = offset + len(run)
        offset += len(run) + 1
    if done < len(data) or not pieces:
        pieces.append(data[done:])
    return pieces


def _claim_time(claim: Mapping[str, str]) -> datetime | None:
    """When the claim's payload was stored (claims written before turnkeep recorded it, or
    crafted ones, have no usable time)."""
    try:
        when = datetime.fromisoformat(claim["stored_at"])
    except (KeyError, TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else None


def describe_duration(span: timedelta) -> str:
    """A duration in words, to the unit that reads best."""
    seconds = span.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size or unit == "second":
            value = f"{seconds / size:.3g}"
            return f"{value} {unit}{'' if value == '1' else 's'}"
    raise AssertionError("unreachable")


def write_durably(path: Path, data: bytes, *, what: str, where: str) -> None:
    """Write ``path`` under a temporary name, flushed to disk and renamed into place, so a
    reader never sees half a file and a crash never loses one that history references."""
    try:
        path.parent.mkdir(mode=OWNER_ONLY_DIR_MODE, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".tmp")
    except OSError as err:
        raise PayloadStorageError(f"cannot write {what} to {path.parent} ({where}): {err}") from err
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)
    payload_bytes_stored("local", len(data))


def fsync_directory(directory: Path) -> None:
    """Make the rename durable too (a payload referenced from history must survive a crash)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- garbage collection (local driver) -------------------------------------------------------

# A writer's temporary file left for this long is a crashed write's (a write takes seconds).
_ABANDONED_TEMP = timedelta(hours=1)
_TEMP = re.compile(r"\.[0-9a-f]{16}\..+\.tmp")
# A payload a sweep has renamed aside before deleting it (left behind if the sweep crashed).
_ASIDE = re.compile(r"\.([0-9a-f]{64})\.[0-9a-f]+\.gc")


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
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return report  # nothing stored yet
    for entry in entries:
        path = Path(entry.path)
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
            old = stat.st_mtime < cutoff
            if _SHA256.fullmatch(entry.name):
                if old and entry.name in keep:
                    report.in_use += 1
                gone = old and entry.name not in keep and (dry_run or remove_if_old(path, cutoff))
            elif aside := _ASIDE.fullmatch(entry.name):
                back = path.with_name(aside[1])
                gone = old if dry_run else remove_if_old(path, cutoff, put_back=back)
            elif _TEMP.fullmatch(entry.name) and stat.st_mtime < temp_cutoff:
                if not dry_run:
                    path.unlink()
                gone = True
            else:
                continue
        except FileNotFoundError:
            continue  # another sweep took it first
        except OSError as err:
            report.errors.append(f"{path}: {err}")
            continue
        if gone:
            report.removed.append(path)
            report.removed_bytes += stat.st_size
        else:
            report.kept += 1
            report.kept_bytes += stat.st_size
    return report


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


# --- S3 --------------------------------------------------------------------------------------


def s3_driver(bucket: str, prefix: str = "") -> StorageDriver:
    """The SDK's S3 driver on an aioboto3 client (opened on first use, in the running loop),
    with every key under ``prefix``."""
    try:
        import aioboto3  # type: ignore[import-not-found,unused-ignore]
        from temporalio.contrib.aws.s3driver.aioboto3 import new_aioboto3_client
    except ImportError as err:
        raise PayloadStorageConfigError(
            f"payload_storage.driver 's3' needs aioboto3, which is not installed ({err}): "
            'pip install "temporalio[aioboto3]"'
        ) from err
    client = _LazyS3Client(lambda: aioboto3.Session().client("s3"), new_aioboto3_client, prefix)
    return S3Driver(client, bucket)


class S3Driver(S3StorageDriver):
    def __init__(self, client: _LazyS3Client, bucket: str) -> None:
        super().__init__(client=client, bucket=bucket, driver_name=S3_DRIVER_NAME)
        # Stored conversations go to the same bucket, through the same client.
        self.objects = client
        self.bucket = bucket
        # What `same_storage` and error messages compare and show.
        self.location = f"s3 bucket {bucket}" + (
            f" prefix {client.prefix}" if client.prefix else ""
        )


class _LazyS3Client(S3StorageDriverClient):
    """An aioboto3 S3 client entered on first use (a converter is built before any event loop
    runs), with ``prefix`` put in front of every key. Claims keep the unprefixed key, so readers
    must use the same prefix."""

    def __init__(
        self,
        open_client: Callable[[], AbstractAsyncContextManager[Any]],
        wrap: Callable[[Any], S3StorageDriverClient],
        prefix: str,
    ) -> None:
        self._open = open_client
        self._wrap = wrap
        self.prefix = prefix.strip("/")
        self._inner: S3StorageDriverClient | None = None
        self._stack = contextlib.AsyncExitStack()
        self._lock = asyncio.Lock()

    async def _client(self) -> S3StorageDriverClient:
        async with self._lock:
            if self._inner is None:
                self._inner = self._wrap(await self._stack.enter_async_context(self._open()))
            return self._inner

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        await (await self._client()).put_object(bucket=bucket, key=self._key(key), data=data)
        payload_bytes_stored("s3", len(data))

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        return await (await self._client()).object_exists(bucket=bucket, key=self._key(key))

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        return await (await self._client()).get_object(bucket=bucket, key=self._key(key))

    def describe(self) -> Mapping[str, str]:
        return {"prefix": self.prefix, **(self._inner.describe() if self._inner else {})}

    async def aclose(self) -> None:
        async with self._lock:
            self._inner = None
            await self._stack.aclose()
