"""The ``s3`` driver: the SDK's ``S3StorageDriver`` (``pip install "turnkeep[s3]"``) on
a client opened lazily, with every key under the configured prefix. Credentials and region come
from the usual AWS environment.

S3 objects are keyed per workflow run and are never swept by turnkeep: a bucket lifecycle rule
expires them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.converter import StorageDriver

from turnkeep.observability.recording import payload_bytes_stored
from turnkeep.payloads.storage.errors import PayloadStorageConfigError

S3_DRIVER_NAME = "aws.s3driver"  # the SDK's default, so other SDKs' S3 drivers can read ours


def s3_driver(bucket: str, prefix: str = "") -> StorageDriver:
    """The SDK's S3 driver on an aioboto3 client (opened on first use, in the running loop),
    with every key under ``prefix``."""
    try:
        import aioboto3  # type: ignore[import-not-found,unused-ignore]
        from temporalio.contrib.aws.s3driver.aioboto3 import new_aioboto3_client
    except ImportError as err:
        raise PayloadStorageConfigError(
            f"payload_storage.driver 's3' needs aioboto3, which is not installed ({err}): "
            'pip install "turnkeep[s3]"'
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
