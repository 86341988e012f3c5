"""Encrypted payloads on a real Temporal dev server: with ``encryption`` on, the history (and the
server's database behind it) holds only ciphertext, stored large payloads are encrypted on disk,
keys rotate, and turnkeep's own readers (the client, ``turnkeep show``) still see everything."""

from __future__ import annotations

import base64
import os
import re
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHistory

from tests.conftest import Harness, history_text, make_settings, turnkeep, write_script
from turnkeep import open_session
from turnkeep.client.connection import connect
from turnkeep.client.turns import get_turn
from turnkeep.config.files import ConfigError, load_settings
from turnkeep.config.settings import Settings
from turnkeep.contract.messages import StopReason
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.payloads.codec import (
    COMPRESSION,
    ENCODING,
    KEY_ID,
    EncryptionCodec,
    PayloadDecryptionError,
    PlaintextPayloadError,
    UnknownKeyError,
)
from turnkeep.payloads.composition import inner_codec
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.worker.build import build_worker

API_KEY = "sk-turnkeep-SECRET-c0dec5"
# Distinctive strings for each kind of content a turn carries.
PROMPT = "prompt-ocelot-5c1e: ask the tool"
ARGUMENT = "argument-pangolin-93b7"
RESULT = "result-axolotl-27fd"
FINAL = "final-answer-quokka-11aa"
CONTENT = (PROMPT, ARGUMENT, RESULT, FINAL)


CLEAR_BY_DESIGN = re.compile(r"searchAttributes\.indexedFields\.Turnkeep\w+$")


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def echo(text: str) -> str:
    """Echo the text back, marked."""
    return f"{RESULT} for {text}"


# 120 KB of incompressible text (hex compresses only to about half), behind a marker.
LARGE_MARK = "stored-narwhal-0b5e"
LARGE = LARGE_MARK + os.urandom(120_000).hex()


def large() -> str:
    """A large tool result."""
    return LARGE


TOOLS = {"tools": [echo, large]}


def encryption(current: str, **keys: str) -> dict[str, Any]:
    return {"current_key": current, "keys": keys}


def playback_agent(script: Path) -> dict[str, Any]:
    return {"test": {"model": "playback", "playback": str(script), "servers": ["tools"]}}


@asynccontextmanager
async def worker_for(temporal: ServerInfo, settings: Settings) -> AsyncIterator[Harness]:
    """A client with the settings' codec and storage, and a worker built from it."""
    client = await connect(temporal.address, temporal.namespace, settings=settings)
    task_queue = f"test-{uuid.uuid4().hex[:10]}"
    async with build_worker(client, settings, function_tools=TOOLS, task_queue=task_queue):
        yield Harness(client, settings, task_queue)


def payloads(history: WorkflowHistory) -> Iterator[tuple[str, Payload]]:
    """Every payload in a history, with where it is, as the server stores it (undecoded)."""

    def walk(node: Any, path: str) -> Iterator[tuple[str, Payload]]:
        if isinstance(node, dict):
            if "metadata" in node and isinstance(node.get("data"), str):
                metadata = {k: base64.b64decode(v) for k, v in node["metadata"].items()}
                yield path, Payload(metadata=metadata, data=base64.b64decode(node["data"]))
            for key, value in node.items():
                yield from walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from walk(value, f"{path}[{i}]")

    yield from walk(history.to_json_dict(), "")


def inflated(data: bytes) -> list[bytes]:
    """Whatever zlib streams start anywhere in ``data`` inflate to."""
    found = []
    for offset in range(len(data)):
        try:
            found.append(zlib.decompressobj().decompress(data[offset:]))
        except zlib.error:
            continue
    return found


def assert_no_plaintext(history: WorkflowHistory, secrets: tuple[str, ...]) -> None:
    raw = b"".join(event.SerializeToString() for event in history.events)
    text = history_text(history)
    for secret in secrets:
        assert secret.encode() not in raw, f"{secret!r} is in the history's bytes"
        assert secret not in text, f"{secret!r} is in the history's decoded JSON"
    for where, payload in payloads(history):
        for plain in inflated(payload.data):
            assert not any(s.encode() in plain for s in secrets), f"zlib plaintext at {where}"


# -- a whole turn ------------------------------------------------------------------------------


async def test_an_encrypted_turn_leaves_no_plaintext_in_the_history(
    temporal: ServerInfo,
    client: Client,
    fake: FakeModelApi,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The config a user would write: the key from the environment, not the file.
    monkeypatch.setenv("TURNKEEP_TEST_KEY", new_key())
    config = tmp_path / "turnkeep.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "encryption": encryption("2026-12", **{"2026-12": "${TURNKEEP_TEST_KEY}"}),
                "anthropic": {"api_key": API_KEY, "base_url": fake.base_url_anthropic},
                "agents": {"test": {"model": "anthropic.test-model", "servers": ["tools"]}},
                "payload_storage": {"path": str(tmp_path / "payloads")},
            }
        )
    )
    settings = load_settings(config)
    fake.script(
        Reply.tool_calls(("call_1", "tools__echo", {"text": ARGUMENT})),
        Reply.text(FINAL),
    )
    async with worker_for(temporal, settings) as h:
        turn = await h.start(PROMPT)
        result = await turn.result()
    # The codec round-trips: the worker and the client read everything back.
    assert result.final is not None and result.final.text == FINAL
    tool_texts = [r.text for m in result.messages for r in (m.tool_results or {}).values()]
    assert tool_texts == [f"{RESULT} for {ARGUMENT}"]
    assert PROMPT in str(fake.requests[1].body)  # the model saw it all, in clear

    # Someone with the history but not the keys: the session client has no codec.
    history = await client.get_workflow_handle(turn.workflow_id).fetch_history()
    assert_no_plaintext(history, (*CONTENT, API_KEY))
    encrypted = [p for where, p in payloads(history) if p.metadata.get("encoding") == ENCODING]
    assert len(encrypted) > 10
    assert {p.metadata[KEY_ID] for p in encrypted} == {b"2026-12"}
    # What stays in clear: turnkeep's search attributes (the server indexes them).
    clear = {w for w, p in payloads(history) if p not in encrypted}
    assert clear and all(CLEAR_BY_DESIGN.search(where) for where in clear), clear

    # Decrypted, the payloads hold the turn, and still never the provider's key.
    codec = inner_codec(h.client.data_converter.payload_codec)
    assert isinstance(codec, EncryptionCodec)
    decrypted = b"".join(p.SerializeToString() for p in await codec.decode(encrypted))
    assert all(s.encode() in decrypted for s in CONTENT)
    assert API_KEY.encode() not in decrypted

    # `turnkeep show` with the config decrypts it for the user.
    shown = turnkeep(
        "show", turn.workflow_id, "--config", str(config), temporal=temporal, cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr + shown.stdout
    for secret in CONTENT:
        assert secret in shown.stdout
    assert API_KEY not in shown.stdout + shown.stderr


async def test_failure_messages_are_encrypted_too(
    temporal: ServerInfo, client: Client, fake: FakeModelApi, tmp_path: Path
) -> None:
    # A provider error can quote the request; it travels as an activity failure.
    refusal = "refused-wombat-71c2: roles must alternate"
    settings = make_settings(
        tmp_path,
        encryption=encryption("k1", k1=new_key()),
        anthropic={"api_key": API_KEY, "base_url": fake.base_url_anthropic},
        agents={"test": {"model": "anthropic.test-model"}},
    )
    fake.script(Reply.error(400, refusal))
    async with worker_for(temporal, settings) as h:
        turn = await h.start(PROMPT)
        result = await turn.result()
    assert result.stop_reason == StopReason.ERROR
    assert result.final is not None and refusal in str(result.final.channels)
    history = await client.get_workflow_handle(turn.workflow_id).fetch_history()
    assert any(e.HasField("activity_task_failed_event_attributes") for e in history.events)
    assert_no_plaintext(history, (refusal, PROMPT))


# -- large payloads in storage -------------------------------------------------------------------


async def test_stored_large_payloads_are_encrypted_on_disk(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    store = tmp_path / "payloads"
    script = write_script(
        tmp_path / "s.json",
        {"tool_calls": {"c1": {"name": "tools__large", "arguments": {}}}},
        "done",
    )
    settings = make_settings(
        tmp_path,
        encryption=encryption("k1", k1=new_key()),
        agents=playback_agent(script),
        payload_storage={"path": str(store), "threshold_bytes": 32 * 1024},
    )
    async with worker_for(temporal, settings) as h:
        turn = await h.start(PROMPT)
        result = await turn.result()
    assert [r.text for m in result.messages for r in (m.tool_results or {}).values()] == [LARGE]

    # The SDK encodes before it stores: every stored file is an encrypted payload.
    files = [path.read_bytes() for path in store.iterdir()]
    assert files, "nothing was stored"
    codec = inner_codec(h.client.data_converter.payload_codec)
    assert isinstance(codec, EncryptionCodec)
    for data in files:
        assert LARGE_MARK.encode() not in data and PROMPT.encode() not in data
        stored = Payload()
        stored.ParseFromString(data)
        assert stored.metadata["encoding"] == ENCODING and stored.metadata[KEY_ID] == b"k1"
        # Compressed first (hex halves), then encrypted: nothing in it inflates.
        [plain] = await codec.decode([stored])
        assert LARGE_MARK.encode() in plain.data
        assert stored.metadata[COMPRESSION] == b"zlib"
        assert len(stored.data) < 0.6 * len(plain.SerializeToString())
        for offset in (0, 12):
            with pytest.raises(zlib.error):
                zlib.decompress(stored.data[offset:])
    # The history holds references to them, and no plaintext either.
    history = await client.get_workflow_handle(turn.workflow_id).fetch_history()
    assert '"hash_value"' in history_text(history)
    assert_no_plaintext(history, (LARGE_MARK, PROMPT))


# -- keys --------------------------------------------------------------------------------------


async def test_keys_rotate_and_a_removed_key_is_named(temporal: ServerInfo, tmp_path: Path) -> None:
    key_a, key_b = new_key(), new_key()
    script = write_script(
        tmp_path / "s.json",
        {"tool_calls": {"c1": {"name": "tools__echo", "arguments": {"text": ARGUMENT}}}},
        FINAL,
    )

    def settings(enc: dict[str, Any]) -> Settings:
        return make_settings(tmp_path, encryption=enc, agents=playback_agent(script))

    async with worker_for(temporal, settings(encryption("a", a=key_a))) as h:
        old = await h.start(PROMPT)
        await old.result()

    # Rotated: new payloads use b, and a still reads the old turn.
    rotated = settings(encryption("b", a=key_a, b=key_b))
    async with worker_for(temporal, rotated) as h:
        new = await h.start(PROMPT)
        assert (await new.result()).final.text == FINAL  # type: ignore[union-attr]
        reread = await get_turn(h.client, old.workflow_id).result()
    assert reread.final is not None and reread.final.text == FINAL
    new_ids = {
        p.metadata[KEY_ID]
        for _, p in payloads(await new.handle.fetch_history())
        if p.metadata.get("encoding") == ENCODING
    }
    assert new_ids == {b"b"}

    # Key a removed: the old turn cannot be read, and the error says which key is missing.
    without_a = await connect(temporal.address, settings=settings(encryption("b", b=key_b)))
    with pytest.raises(UnknownKeyError, match=r"encrypted with key 'a'.*lists 'b'"):
        await get_turn(without_a, old.workflow_id).result()
    # The new turn still reads.
    assert (await get_turn(without_a, new.workflow_id).result()).final is not None
    # `turnkeep show` says the same, and without any encryption config it says that.
    config = tmp_path / "turnkeep.yaml"
    for section, error in (
        ({"encryption": encryption("b", b=key_b)}, "encrypted with key 'a', which this"),
        ({}, "encrypted with key 'a', but this turnkeep config has no `encryption`"),
    ):
        config.write_text(yaml.safe_dump(section))
        shown = turnkeep(
            "show", old.workflow_id, "--config", str(config), temporal=temporal, cwd=tmp_path
        )
        assert shown.returncode == 2 and error in shown.stderr, shown.stdout + shown.stderr
        assert "Traceback" not in shown.stderr


async def test_a_worker_refuses_a_client_without_its_keys(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, encryption=encryption("k1", k1=new_key()))
    # The session client has no codec: its worker would write every payload in clear.
    with pytest.raises(ValueError, match="disagree on payload encryption") as err:
        build_worker(client, settings, task_queue="unused")
    assert "no payload encryption" in str(err.value) and "'k1'" in str(err.value)
    other = await connect(
        temporal.address,
        settings=make_settings(tmp_path, encryption=encryption("k1", k1=new_key())),
    )
    with pytest.raises(ValueError, match="disagree on payload encryption"):
        build_worker(other, settings, task_queue="unused")
    same = await connect(temporal.address, settings=settings)
    build_worker(same, settings, task_queue="unused")


# -- the codec on its own ------------------------------------------------------------------------


def json_payload(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=f'"{text}"'.encode())


async def test_compression_only_when_it_shrinks_and_nonces_differ() -> None:
    codec = EncryptionCodec({"k": os.urandom(32)}, "k")
    small, repetitive = json_payload("hi"), json_payload("la" * 5000)
    sealed_small, sealed_rep, again = await codec.encode([small, repetitive, repetitive])
    assert COMPRESSION not in sealed_small.metadata
    assert sealed_rep.metadata[COMPRESSION] == b"zlib" and len(sealed_rep.data) < 500
    assert sealed_rep.data[:12] != again.data[:12] and sealed_rep.data != again.data
    assert await codec.decode([sealed_small, sealed_rep, again]) == [small, repetitive, repetitive]
    # Plaintext is refused unless the config allows it (older payloads, plain clients).
    with pytest.raises(PlaintextPayloadError, match="requires encrypted payloads"):
        await codec.decode([small])
    codec.allow_plaintext = True
    assert await codec.decode([small]) == [small]


async def test_tampering_is_detected() -> None:
    codec = EncryptionCodec({"a": os.urandom(32), "b": os.urandom(32)}, "a")
    [sealed] = await codec.encode([json_payload("la" * 5000)])

    flipped = Payload()
    flipped.CopyFrom(sealed)
    flipped.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    # The key id and the compression flag are authenticated as well.
    relabelled = Payload()
    relabelled.CopyFrom(sealed)
    relabelled.metadata[KEY_ID] = b"b"
    uncompressed = Payload()
    uncompressed.CopyFrom(sealed)
    del uncompressed.metadata[COMPRESSION]
    for tampered in (flipped, relabelled, uncompressed):
        with pytest.raises(PayloadDecryptionError, match="failed authentication"):
            await codec.decode([tampered])


def test_bad_keys_are_refused_without_showing_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = base64.b64encode(b"sixteen byte key").decode()
    monkeypatch.setenv("TURNKEEP_TEST_KEY", short)
    config = tmp_path / "turnkeep.yaml"
    config.write_text(yaml.safe_dump({"encryption": encryption("k1", k1="${TURNKEEP_TEST_KEY}")}))
    with pytest.raises(ConfigError) as err:
        load_settings(config)
    assert "encryption.keys['k1'] decodes to 16 bytes" in str(err.value)
    assert short not in str(err.value)

    # A secrets file beside the config is where keys may live too; it is merged over the file.
    (tmp_path / "turnkeep.secrets.yaml").write_text(
        yaml.safe_dump({"encryption": {"keys": {"k1": "not base64!"}}})
    )
    with pytest.raises(ConfigError) as err:
        load_settings(config)
    assert "encryption.keys['k1'] is not base64" in str(err.value)
    assert "not base64!" not in str(err.value)

    with pytest.raises(ValueError, match=r"current_key 'k2' is not in encryption.keys"):
        Settings.model_validate({"encryption": encryption("k2", k1=new_key())})
    with pytest.raises(ValueError, match="AES-256 needs 32"):
        EncryptionCodec({"k": os.urandom(16)}, "k")


async def test_an_encrypted_session_hands_its_turns_their_conversation_encrypted(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    # A session writes each turn's input itself (``turnkeep.workflows.session_turns``): it goes
    # through the codec like every other payload.
    settings = make_settings(
        tmp_path,
        encryption=encryption("2026-12", **{"2026-12": new_key()}),
        agents={"test": {"model": "passthrough"}},
    )
    async with worker_for(temporal, settings) as h:
        session = await open_session(h.client, agent="test", task_queue=h.task_queue)
        for prompt in (PROMPT, FINAL):
            sent = await session.send(prompt)
            async for _ in session.messages(until_turn=sent.turn):
                pass
        second = await get_turn(h.client, sent.turn_id).result()
        await session.close()
        closed = await session.result()
    assert [m.text for m in second.history] == [PROMPT, PROMPT, FINAL, FINAL]
    assert [m.text for m in closed.history] == [PROMPT, PROMPT, FINAL, FINAL]
    for workflow_id in (session.session_id, sent.turn_id):
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        assert_no_plaintext(history, (PROMPT, FINAL))
