"""The ``local`` driver: one file per payload in a directory, named by the SHA-256 of its bytes.

Client and workers must see the same directory: one machine, or a shared filesystem. Files that
nobody stores or reads any more are deleted by the sweep (``turnkeep.payloads.storage.sweep``),
which ages them by the mtime every store and read here refreshes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from turnkeep.config.paths import OWNER_ONLY_DIR_MODE
from turnkeep.observability.recording import payload_bytes_stored
from turnkeep.payloads.storage.errors import (
    MissingPayloadError,
    PayloadExpiredError,
    PayloadStorageError,
)
from turnkeep.support.durations import describe_duration

LOCAL_DRIVER_NAME = "turnkeep.local"
# How a payload file is named (and a stored conversation's segment file).
SHA256 = re.compile(r"[0-9a-f]{64}")


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
        if not SHA256.fullmatch(digest):
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
