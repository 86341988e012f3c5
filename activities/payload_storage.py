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

The SDK's API is experimental (temporalio 1.35); this module is the one place that touches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
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

from activities.settings import PayloadStorageSettings, Settings

LOCAL_DRIVER_NAME = "turnkeep.local"
S3_DRIVER_NAME = "aws.s3driver"  # the SDK's default, so other SDKs' S3 drivers can read ours
_SHA256 = re.compile(r"[0-9a-f]{64}")


class PayloadStorageError(RuntimeError):
    """A stored payload could not be written or read back."""


class MissingPayloadError(PayloadStorageError):
    """A history references a payload that is not in the storage directory."""


class PayloadStorageConfigError(ValueError):
    """``payload_storage`` names a driver this installation cannot provide."""


def state_home() -> Path:
    """turnkeep's state directory, not created: $TURNKEEP_STATE_DIR, else
    $XDG_STATE_HOME/turnkeep, else ~/.local/state/turnkeep (``worker.embedded.state_dir()``
    creates it)."""
    # Empty variables count as unset, as the XDG spec asks.
    if explicit := os.environ.get("TURNKEEP_STATE_DIR"):
        return Path(explicit)
    if xdg := os.environ.get("XDG_STATE_HOME"):
        return Path(xdg) / "turnkeep"
    return Path.home() / ".local" / "state" / "turnkeep"


def payload_directory(settings: Settings | PayloadStorageSettings) -> Path:
    """Where the ``local`` driver keeps payloads: ``payload_storage.path`` (relative to the
    config file's directory), else ``<state dir>/payloads``."""
    config = settings.payload_storage if isinstance(settings, Settings) else settings
    if config.path is None:
        path = state_home() / "payloads"
    elif isinstance(settings, Settings):
        path = settings.path(config.path.expanduser())
    else:
        path = config.path.expanduser()
    return Path(os.path.abspath(path))


def external_storage(settings: Settings | PayloadStorageSettings) -> ExternalStorage | None:
    """The ``ExternalStorage`` that ``payload_storage`` describes; ``None`` when it is off."""
    config = settings.payload_storage if isinstance(settings, Settings) else settings
    driver: StorageDriver
    if config.driver == "off":
        return None
    if config.driver == "local":
        driver = LocalDirectoryDriver(payload_directory(settings))
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
    """

    def __init__(self, directory: Path | str, *, driver_name: str = LOCAL_DRIVER_NAME) -> None:
        self.directory = Path(os.path.abspath(Path(directory).expanduser()))
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
        blobs = [payload.SerializeToString() for payload in payloads]
        digests = await asyncio.gather(*(asyncio.to_thread(self._write, b) for b in blobs))
        return [
            StorageDriverClaim(claim_data={"hash_algorithm": "sha256", "hash_value": digest})
            for digest in digests
        ]

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
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size == len(data):
                return digest  # already stored (same bytes: the name is their digest)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{digest[:16]}.", suffix=".tmp")
        except OSError as err:
            raise PayloadStorageError(
                f"cannot write payloads to {self.directory} (payload_storage.path): {err}"
            ) from err
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
        _fsync_directory(self.directory)
        return digest

    def _read(self, claim: Mapping[str, str]) -> Payload:
        algorithm, digest = claim.get("hash_algorithm"), claim.get("hash_value", "")
        if algorithm != "sha256":
            raise PayloadStorageError(f"unsupported hash algorithm in payload claim: {algorithm!r}")
        path = self.path_for(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise MissingPayloadError(
                f"externally stored payload {path} is missing: the workflow history references "
                f"it (sha256 {digest}) but it is not in {self.directory}, the directory "
                "payload_storage.path names here. Point payload_storage.path at the directory "
                "the worker that wrote it uses (clients and workers must share it), or restore "
                "the file."
            ) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise PayloadStorageError(
                f"externally stored payload {path} is damaged: its contents no longer match "
                "their SHA-256"
            )
        payload = Payload()
        payload.ParseFromString(data)
        return payload


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable too (a payload referenced from history must survive a crash)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
    return _S3Driver(client, bucket)


class _S3Driver(S3StorageDriver):
    def __init__(self, client: _LazyS3Client, bucket: str) -> None:
        super().__init__(client=client, bucket=bucket, driver_name=S3_DRIVER_NAME)
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
