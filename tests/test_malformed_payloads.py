"""Payloads no worker can decode, sent by a client that is not turnkeep's (a raw Temporal client
with its own data converter), on a real dev server: a start fails the workflow at once with a
message naming the problem, instead of retrying its first workflow task for ever; an update,
query or signal carrying one is refused without harming the running turn."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import RawValue
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)
from temporalio.exceptions import ApplicationError

from tests.conftest import Harness, eventually, make_settings, write_script
from turnkeep.client.connection import connect
from turnkeep.client.turns import get_turn
from turnkeep.config.settings import Settings
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.payloads.codec import ENCODING, KEY_ID
from turnkeep.payloads.storage.local import LOCAL_DRIVER_NAME, LocalDirectoryDriver
from turnkeep.worker.build import build_worker
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

TURN = {"agent": "test", "messages": ["hello"]}
_released = threading.Event()


async def hold() -> str:
    """Wait until the test lets the turn go on."""
    await asyncio.to_thread(_released.wait, 120)
    return "released"


def settings(tmp_path: Path, **config: Any) -> Settings:
    script = write_script(
        tmp_path / "s.json",
        {"tool_calls": {"c1": {"name": "tools__hold", "arguments": {}}}},
        "done",
    )
    agents = {"test": {"model": "playback", "playback": str(script), "servers": ["tools"]}}
    return make_settings(
        tmp_path,
        agents=agents,
        payload_storage={"path": str(tmp_path / "payloads"), "threshold_bytes": 1024},
        **config,
    )


def encrypted(tmp_path: Path, **options: Any) -> Settings:
    key = base64.b64encode(os.urandom(32)).decode()
    return settings(tmp_path, encryption={"current_key": "k1", "keys": {"k1": key}, **options})


@asynccontextmanager
async def worker_for(temporal: ServerInfo, config: Settings) -> AsyncIterator[Harness]:
    client = await connect(temporal.address, temporal.namespace, settings=config)
    task_queue = f"test-{uuid.uuid4().hex[:10]}"
    tools = {"tools": [hold]}
    async with build_worker(client, config, function_tools=tools, task_queue=task_queue):
        yield Harness(client, config, task_queue)


async def raw_client(temporal: ServerInfo, converter: DataConverter | None = None) -> Client:
    """Any Temporal client: no codec, no turnkeep converter, just the SDK's defaults."""
    return await Client.connect(
        temporal.address,
        namespace=temporal.namespace,
        data_converter=converter or DataConverter.default,
    )


async def start_raw(h: Harness, client: Client, *args: Any) -> str:
    workflow_id = f"malformed-{uuid.uuid4().hex[:10]}"
    await client.start_workflow(WORKFLOW_NAME, args=args, id=workflow_id, task_queue=h.task_queue)
    return workflow_id


async def failure_of(h: Harness, workflow_id: str) -> ApplicationError:
    """What the workflow failed with, read by turnkeep's own client; a bounded wait, so a
    workflow task retried for ever fails the test instead of hanging it."""
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(h.client.get_workflow_handle(workflow_id).result(), 60)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError), cause
    assert cause.non_retryable
    return cause


def fake_encrypted(key_id: bytes, data: bytes) -> RawValue:
    return RawValue(Payload(metadata={"encoding": ENCODING, KEY_ID: key_id}, data=data))


@pytest.mark.parametrize(
    ("payload", "error_type", "message"),
    [
        (fake_encrypted(b"k1", os.urandom(64)), "PayloadDecryptionError", "failed authentication"),
        (fake_encrypted(b"k1", b"short"), "PayloadDecryptionError", "too short"),
        (fake_encrypted(b"2019-01", os.urandom(64)), "UnknownKeyError", "key '2019-01', which"),
        (TURN, "PlaintextPayloadError", "requires encrypted payloads"),
    ],
    ids=["garbage", "too-short", "unknown-key", "plaintext"],
)
async def test_an_undecodable_start_fails_the_workflow_naming_the_problem(
    temporal: ServerInfo, tmp_path: Path, payload: Any, error_type: str, message: str
) -> None:
    async with worker_for(temporal, encrypted(tmp_path)) as h:
        workflow_id = await start_raw(h, await raw_client(temporal), payload)
        error = await failure_of(h, workflow_id)
    assert error.type == error_type
    assert message in error.message and "sent to this workflow" in error.message


async def test_plaintext_is_accepted_when_the_config_allows_it(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    _released.set()
    async with worker_for(temporal, encrypted(tmp_path, allow_plaintext=True)) as h:
        workflow_id = await start_raw(h, await raw_client(temporal), TURN)
        result = await asyncio.wait_for(get_turn(h.client, workflow_id).result(), 60)
    assert result.final is not None and result.final.text == "done"


async def test_an_encrypted_start_to_a_worker_without_keys_fails_the_workflow(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    async with worker_for(temporal, settings(tmp_path)) as h:
        workflow_id = await start_raw(
            h, await raw_client(temporal), fake_encrypted(b"k1", os.urandom(64))
        )
        error = await failure_of(h, workflow_id)
    assert error.type == "EncryptionNotConfiguredError"
    assert "has no `encryption` section" in error.message


async def test_a_payload_in_an_unknown_encoding_fails_only_what_it_was_sent_for(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    _released.clear()
    unknown = RawValue(Payload(metadata={"encoding": b"binary/zzz"}, data=b"\x00\x01"))
    unnamed = RawValue(Payload(data=b"\x00\x01"))
    async with worker_for(temporal, settings(tmp_path)) as h:
        client = await raw_client(temporal)
        # A start fails the workflow at once, naming the encoding.
        for payload, named in ((unknown, "'binary/zzz'"), (unnamed, "no encoding")):
            error = await failure_of(h, await start_raw(h, client, payload))
            assert error.type == "UnknownEncodingError"
            assert named in error.message and "sent to this workflow" in error.message
            assert "json/plain" in error.message  # what it reads instead
        # An update or a query is refused, and the running turn goes on.
        turn = await h.start("hello")
        await eventually(
            lambda: _pending_tool(turn.handle), "the turn waits in its tool", within=60
        )
        raw = client.get_workflow_handle(turn.workflow_id)
        with pytest.raises(WorkflowUpdateFailedError) as rejected:
            await asyncio.wait_for(raw.execute_update("wait_for_messages", unknown), 60)
        assert isinstance(rejected.value.cause, ApplicationError)
        assert rejected.value.cause.type == "UnknownEncodingError"
        with pytest.raises(WorkflowQueryFailedError):
            await asyncio.wait_for(raw.query("transcript", unknown), 60)
        _released.set()
        result = await asyncio.wait_for(turn.result(), 60)
    assert result.final is not None and result.final.text == "done"


class _Crafted(StorageDriver):
    """Writes references with whatever claim and driver name it is given, storing nothing."""

    def __init__(self, name: str, claim: dict[str, str]) -> None:
        self._name, self._claim = name, claim

    def name(self) -> str:
        return self._name

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        return [StorageDriverClaim(claim_data=self._claim) for _ in payloads]

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        raise NotImplementedError


def referencing(driver: StorageDriver) -> DataConverter:
    """A plain client's converter that puts every payload in ``driver``."""
    return DataConverter(
        external_storage=ExternalStorage(drivers=[driver], payload_size_threshold=1)
    )


async def test_a_bad_storage_reference_fails_the_workflow_naming_the_problem(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    missing = LocalDirectoryDriver(tmp_path / "elsewhere")  # a directory the worker never reads
    cases = [
        (missing, "MissingPayloadError", "is missing"),
        (
            _Crafted(LOCAL_DRIVER_NAME, {"hash_algorithm": "sha256", "hash_value": "../../etc"}),
            "PayloadStorageError",
            "not a SHA-256 hex digest",
        ),
        (
            _Crafted(LOCAL_DRIVER_NAME, {"hash_algorithm": "md5", "hash_value": "0" * 64}),
            "PayloadStorageError",
            "unsupported hash algorithm",
        ),
        (_Crafted("no-such-driver", {}), "ValueError", "No driver found with name"),
    ]
    async with worker_for(temporal, settings(tmp_path)) as h:
        for driver, error_type, message in cases:
            client = await raw_client(temporal, referencing(driver))
            error = await failure_of(h, await start_raw(h, client, TURN))
            assert (error.type, message in error.message) == (error_type, True), error


async def test_undecodable_updates_queries_and_signals_leave_a_running_turn_alone(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    _released.clear()
    async with worker_for(temporal, encrypted(tmp_path)) as h:
        turn = await h.start("hello")
        await eventually(
            lambda: _pending_tool(turn.handle), "the turn waits in its tool", within=60
        )
        raw = (await raw_client(temporal)).get_workflow_handle(turn.workflow_id)
        # The worker's failures are encrypted, so a plain client sees only their types. A
        # plain 0 would be a valid argument to both, were plaintext accepted.
        bad_payloads = {
            "PayloadDecryptionError": fake_encrypted(b"k1", os.urandom(64)),
            "PlaintextPayloadError": 0,
        }
        for error_type, bad in bad_payloads.items():
            with pytest.raises(WorkflowUpdateFailedError) as rejected:
                await asyncio.wait_for(raw.execute_update("wait_for_messages", bad), 60)
            assert isinstance(rejected.value.cause, ApplicationError)
            assert rejected.value.cause.type == error_type
            with pytest.raises(WorkflowQueryFailedError):
                await asyncio.wait_for(raw.query("transcript", bad), 60)
            await raw.signal("no_such_signal", bad)
        _released.set()
        result = await asyncio.wait_for(turn.result(), 60)
    assert result.final is not None and result.final.text == "done"


async def _pending_tool(handle: Any) -> bool:
    return bool((await handle.describe()).raw_description.pending_activities)
