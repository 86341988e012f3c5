"""The codec server over real HTTP: Temporal's remote codec protocol behind a token, CORS for
configured Web UI origins only, the browser sign-in cookie, and the CLI commands that start it
beside the embedded server's Web UI."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import WorkflowHistory

from tests.conftest import eventually, history_text, make_settings, write_script
from tests.test_codec import playback_agent, worker_for
from turnkeep.config.files import load_settings
from turnkeep.config.settings import EncryptionSettings
from turnkeep.devserver.codec import ensure_background_codec_server, stop_background_codec_server
from turnkeep.devserver.embedded import (
    ServerInfo,
    build_argv,
    ensure_background_server,
    find_temporal_binary,
    free_port,
    stop_background_server,
)
from turnkeep.payloads.codec import KEY_ID, EncryptionCodec
from turnkeep.payloads.codec_server import CodecServer, CodecServerError

KEY = base64.b64encode(os.urandom(32)).decode()
TOKEN = "codec-token-" + base64.b64encode(os.urandom(18)).decode()
UI = "http://127.0.0.1:8233"
ELSEWHERE = "http://127.0.0.1:9999"
PLAIN = [
    Payload(metadata={"encoding": b"json/plain"}, data=b'"tool said: pelican-4a2c"'),
    Payload(metadata={"encoding": b"json/plain"}, data=json.dumps({"n": 1}).encode()),
]


def encryption(**server: Any) -> EncryptionSettings:
    config = {"token": TOKEN, "port": 0, "origins": [UI], **server}
    settings = make_settings(
        Path.cwd(), encryption={"current_key": "k1", "keys": {"k1": KEY}, "codec_server": config}
    )
    assert settings.encryption is not None
    return settings.encryption


# -- HTTP, as a browser or the Temporal CLI would speak it ------------------------------------


@dataclass
class Answer:
    status: int
    headers: Message
    body: bytes

    def cors(self) -> dict[str, str]:
        """The CORS headers, names in lower case."""
        return {
            k.lower(): v for k, v in self.headers.items() if k.lower().startswith("access-control-")
        }


def _request(method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Answer:
    request = urllib.request.Request(url, data=body, headers=dict(headers), method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, response.headers, response.read())
    except urllib.error.HTTPError as err:
        return Answer(err.code, err.headers, err.read())


async def http(method: str, url: str, body: bytes | None = None, **headers: str) -> Answer:
    return await asyncio.to_thread(
        _request, method, url, body, {k.replace("_", "-"): v for k, v in headers.items()}
    )


def body_of(payloads: list[Payload]) -> bytes:
    return json_format.MessageToJson(Payloads(payloads=payloads)).encode()


def payloads_of(answer: Answer) -> list[Payload]:
    parsed = Payloads()
    json_format.Parse(answer.body, parsed)
    return list(parsed.payloads)


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content_Type": "application/json"}


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, EncryptionCodec]]:
    settings = encryption()
    async with CodecServer(settings) as url:
        yield url, EncryptionCodec.from_settings(settings)


# -- the protocol ------------------------------------------------------------------------------


async def test_decode_and_encode_round_trip_with_the_token(
    server: tuple[str, EncryptionCodec],
) -> None:
    url, codec = server
    sealed = await codec.encode(PLAIN)
    # What the Web UI sends: its query parameter, the namespace header.
    decoded = await http(
        "POST",
        f"{url}/decode?preserveStorageRefs=true",
        body_of(sealed),
        X_Namespace="default",
        **bearer(),
    )
    assert decoded.status == 200, decoded.body
    assert payloads_of(decoded) == PLAIN
    # Payloads it did not encrypt (storage references) come back untouched.
    mixed = await http("POST", f"{url}/decode", body_of([sealed[0], PLAIN[1]]), **bearer())
    assert payloads_of(mixed) == PLAIN

    encoded = await http("POST", f"{url}/encode", body_of(PLAIN), **bearer())
    assert encoded.status == 200
    ciphertext = payloads_of(encoded)
    assert b"pelican" not in encoded.body and all(p.metadata[KEY_ID] == b"k1" for p in ciphertext)
    assert await codec.decode(ciphertext) == PLAIN


async def test_requests_without_the_token_are_refused(
    server: tuple[str, EncryptionCodec],
) -> None:
    url, codec = server
    body = body_of(await codec.encode(PLAIN))
    for headers in (
        {},
        bearer("wrong-token-0000000000"),
        bearer(TOKEN[:-1]),
        bearer(TOKEN + "x"),
        {"Authorization": f"Basic {TOKEN}"},
    ):
        answer = await http("POST", f"{url}/decode", body, **headers)
        assert answer.status == 401, headers
        assert b"pelican" not in answer.body
    assert (await http("POST", f"{url}/encode", body_of(PLAIN))).status == 401


async def test_bad_requests_get_clear_errors(server: tuple[str, EncryptionCodec]) -> None:
    url, _ = server
    garbled = await http("POST", f"{url}/decode", b'{"payloads": 3}', **bearer())
    assert garbled.status == 400 and b'{"payloads": [...]}' in garbled.body
    other_key = EncryptionCodec({"2025-01": os.urandom(32)}, "2025-01")
    foreign = await http(
        "POST", f"{url}/decode", body_of(await other_key.encode(PLAIN)), **bearer()
    )
    assert foreign.status == 400
    assert b"encrypted with key '2025-01'" in foreign.body


async def test_temporal_cli_reads_a_turn_through_it(temporal: ServerInfo, tmp_path: Path) -> None:
    # Temporal's own codec client (`temporal --codec-endpoint`) against a real encrypted turn.
    prompt = "prompt-heron-60d1"
    settings = make_settings(
        tmp_path,
        encryption={"current_key": "k1", "keys": {"k1": KEY}, "codec_server": {"token": TOKEN}},
        agents=playback_agent(write_script(tmp_path / "s.json", "reply-ibis-8e0f")),
    )
    assert settings.encryption is not None
    async with worker_for(temporal, settings) as h:
        turn = await h.start(prompt)
        await turn.result()

    def show(*codec: str) -> str:
        """The history as `temporal workflow show` prints it, payload data decoded."""
        argv = [str(find_temporal_binary()), "workflow", "show", "-w", turn.workflow_id]
        argv += ["--address", temporal.address, "--output", "json", *codec]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
        return history_text(WorkflowHistory.from_json(turn.workflow_id, out))

    async with CodecServer(settings.encryption, port=0) as url:
        decoded = await asyncio.to_thread(
            show, "--codec-endpoint", url, "--codec-auth", f"Bearer {TOKEN}"
        )
        assert prompt in decoded and "reply-ibis-8e0f" in decoded
        assert prompt not in await asyncio.to_thread(show)
        with pytest.raises(subprocess.CalledProcessError):  # a wrong token is refused
            await asyncio.to_thread(show, "--codec-endpoint", url, "--codec-auth", "Bearer nope")


# -- browsers ----------------------------------------------------------------------------------


async def test_cors_only_for_configured_origins(server: tuple[str, EncryptionCodec]) -> None:
    url, codec = server
    preflight = {
        "Access_Control_Request_Method": "POST",
        "Access_Control_Request_Headers": "authorization,content-type,x-namespace",
    }
    allowed = await http("OPTIONS", f"{url}/decode", Origin=UI, **preflight)
    assert allowed.status == 204
    cors = allowed.cors()
    assert cors["access-control-allow-origin"] == UI  # exactly, as credentials require
    assert cors["access-control-allow-credentials"] == "true"
    assert {"Authorization", "Content-Type", "X-Namespace"} <= {
        h.strip() for h in cors["access-control-allow-headers"].split(",")
    }
    assert "POST" in cors["access-control-allow-methods"]

    refused = await http("OPTIONS", f"{url}/decode", Origin=ELSEWHERE, **preflight)
    assert refused.status == 403 and refused.cors() == {}
    # A request from another origin is refused even with the token; one from the UI is not.
    body = body_of(await codec.encode(PLAIN))
    elsewhere = await http("POST", f"{url}/decode", body, Origin=ELSEWHERE, **bearer())
    assert elsewhere.status == 403 and elsewhere.cors() == {} and b"pelican" not in elsewhere.body
    from_ui = await http("POST", f"{url}/decode", body, Origin=UI, **bearer())
    assert from_ui.status == 200 and from_ui.cors()["access-control-allow-origin"] == UI


async def test_signing_in_sets_a_cookie_that_authorises_the_ui(
    server: tuple[str, EncryptionCodec],
) -> None:
    url, codec = server
    page = await http("GET", f"{url}/login")
    assert page.status == 200 and b'name="token"' in page.body

    form = {"Content_Type": "application/x-www-form-urlencoded"}
    wrong = await http("POST", f"{url}/login", b"token=not-the-token", **form)
    assert wrong.status == 401 and wrong.headers.get("set-cookie") is None

    signed_in = await http(
        "POST", f"{url}/login", f"token={urllib.parse.quote(TOKEN)}".encode(), **form
    )
    assert signed_in.status == 200
    cookie = signed_in.headers["set-cookie"]
    attributes = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/"} <= attributes
    name, value = cookie.split(";")[0].split("=", 1)
    assert TOKEN not in cookie and TOKEN.encode() not in signed_in.body  # a proof, not the token

    # The UI's fetch: its origin, the cookie, no Authorization header.
    body = body_of(await codec.encode(PLAIN))
    json_type = {"Content_Type": "application/json"}
    ok = await http("POST", f"{url}/decode", body, Origin=UI, Cookie=f"{name}={value}", **json_type)
    assert ok.status == 200 and payloads_of(ok) == PLAIN
    forged = await http(
        "POST", f"{url}/decode", body, Origin=UI, Cookie=f"{name}={value[:-2]}00", **json_type
    )
    assert forged.status == 401

    # Signing out ends the session itself: a copy of the cookie no longer works either.
    out = await http("POST", f"{url}/logout", Cookie=f"{name}={value}")
    assert out.status == 200
    again = await http(
        "POST", f"{url}/decode", body, Origin=UI, Cookie=f"{name}={value}", **json_type
    )
    assert again.status == 401


async def test_a_sign_in_expires() -> None:
    async with CodecServer(encryption(session_lifetime="1s")) as url:
        form = {"Content_Type": "application/x-www-form-urlencoded"}
        token = f"token={urllib.parse.quote(TOKEN)}".encode()
        set_cookie = (await http("POST", f"{url}/login", token, **form)).headers["set-cookie"]
        assert "max-age=1" in set_cookie.lower().replace(" ", "")
        cookie = set_cookie.split(";")[0]
        body = body_of(PLAIN)
        assert (await http("POST", f"{url}/encode", body, Cookie=cookie)).status == 200

        async def refused() -> bool:
            return (await http("POST", f"{url}/encode", body, Cookie=cookie)).status == 401

        await eventually(refused, "the sign-in expired")


async def test_a_non_loopback_address_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    async with CodecServer(encryption(), host="127.0.0.1"):
        pass
    assert "plain HTTP" not in caplog.text
    async with CodecServer(encryption(), host="0.0.0.0"):
        pass
    assert "listens on http://0.0.0.0:" in caplog.text and "plain HTTP" in caplog.text


# -- starting it -------------------------------------------------------------------------------


async def test_it_needs_a_token_and_a_free_port() -> None:
    with pytest.raises(CodecServerError, match=r"encryption.codec_server.token is not set"):
        CodecServer(encryption(token=None))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(CodecServerError, match=f"cannot listen on 127.0.0.1:{port}"):
            await CodecServer(encryption(port=port)).start()


def test_the_web_ui_is_given_the_codec_endpoint(tmp_path: Path) -> None:
    binary = tmp_path / "temporal"
    with_ui = build_argv(binary, port=1, ui_port=2, codec_endpoint="http://127.0.0.1:3")
    assert with_ui[with_ui.index("--ui-codec-endpoint") + 1] == "http://127.0.0.1:3"
    headless = build_argv(binary, port=1, ui_port=None, codec_endpoint="http://127.0.0.1:3")
    assert "--ui-codec-endpoint" not in headless


def write_config(path: Path, **server: Any) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "encryption": {
                    "current_key": "k1",
                    "keys": {"k1": "${TURNKEEP_TEST_KEY}"},
                    "codec_server": {"token": "${TURNKEEP_TEST_TOKEN}", **server},
                }
            }
        )
    )
    return path


@pytest.fixture
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNKEEP_TEST_KEY", KEY)
    monkeypatch.setenv("TURNKEEP_TEST_TOKEN", TOKEN)


@pytest.fixture
def cli(tmp_path: Path, secrets_env: None) -> Iterator[Any]:
    """Start ``turnkeep ARGS`` in the background; each is stopped with SIGINT at the end."""
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(*args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"cli-{len(started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "turnkeep.cli", *args],
                cwd=tmp_path,
                env={**os.environ, "COLUMNS": "200"},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append((proc, log))
        return proc, log

    yield start
    for proc, _ in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def serving(url: str, proc: subprocess.Popen[bytes] | None = None) -> Answer | None:
    """The first answer from ``url``; None if ``proc``, the process meant to serve it, exits."""

    async def probe() -> Answer | bool:
        if proc is not None and proc.poll() is not None:
            return True
        try:
            return await http("GET", url)
        except OSError:
            return False

    found = await eventually(probe, f"{url} answers", within=60)
    return found if isinstance(found, Answer) else None


@pytest.mark.slow
async def test_codec_server_command(tmp_path: Path, cli: Any) -> None:
    port = free_port()
    config = write_config(tmp_path / "turnkeep.yaml", port=port)
    proc, log = cli("codec-server", "--config", str(config), "--origin", ELSEWHERE)
    url = f"http://127.0.0.1:{port}"
    assert await serving(f"{url}/login")
    codec = EncryptionCodec({"k1": base64.b64decode(KEY)}, "k1")
    answer = await http("POST", f"{url}/decode", body_of(await codec.encode(PLAIN)), **bearer())
    assert answer.status == 200 and payloads_of(answer) == PLAIN
    # --origin adds to the configured origins.
    preflight = await http(
        "OPTIONS", f"{url}/decode", Origin=ELSEWHERE, Access_Control_Request_Method="POST"
    )
    assert preflight.status == 204
    proc.send_signal(signal.SIGINT)
    assert await asyncio.to_thread(proc.wait, 30) == 0
    output = log.read_text()
    assert f"codec server at {url}" in output and TOKEN not in output and KEY not in output


@pytest.mark.server
async def test_turnkeep_server_runs_the_codec_server_for_its_web_ui(
    tmp_path: Path, cli: Any
) -> None:
    codec_port = free_port()
    config = write_config(tmp_path / "turnkeep.yaml", port=codec_port)
    # The ports were free a moment ago; on a busy machine another dev server may take one first
    # (it picks its internal ports itself), which the server reports as a bind error: start again.
    for attempt in range(3):
        port, ui_port = free_port(), free_port()
        proc, log = cli(
            "server",
            "--config",
            str(config),
            "--port",
            str(port),
            "--ui-port",
            str(ui_port),
            "--db",
            str(tmp_path / f"temporal-{attempt}.db"),
        )
        ui = f"http://127.0.0.1:{ui_port}"
        answer = await serving(f"{ui}/api/v1/settings", proc)
        if answer is not None:
            break
        assert "address already in use" in log.read_text(), log.read_text()
    else:
        raise AssertionError("three starts of turnkeep server met a port already in use")
    settings = json.loads(answer.body)
    assert settings["Codec"]["Endpoint"] == f"http://127.0.0.1:{codec_port}"
    # The UI's own origin may call the codec server without being configured.
    preflight = await http(
        "OPTIONS",
        f"http://127.0.0.1:{codec_port}/decode",
        Origin=ui,
        Access_Control_Request_Method="POST",
    )
    assert preflight.status == 204 and preflight.cors()["access-control-allow-origin"] == ui


@pytest.mark.server
async def test_background_codec_server_is_reused_replaced_and_stopped(
    tmp_path: Path, secrets_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNKEEP_STATE_DIR", str(tmp_path / "state"))
    codec_port = free_port()
    config = write_config(tmp_path / "turnkeep.yaml", port=codec_port)
    settings = load_settings(config)
    url = f"http://127.0.0.1:{codec_port}"
    ui_port = free_port()
    info = await ensure_background_server(port=free_port(), ui_port=ui_port, codec_endpoint=url)
    try:
        assert info.codec_endpoint == url
        ui_answer = await serving(f"{info.ui_url}/api/v1/settings")
        assert ui_answer is not None
        ui_settings = json.loads(ui_answer.body)
        assert ui_settings["Codec"]["Endpoint"] == url

        assert await ensure_background_codec_server(settings, config, ui_origin=info.ui_url) == url
        record = tmp_path / "state" / "codec-server.json"
        first = json.loads(record.read_text())["pid"]
        assert TOKEN not in record.read_text() and KEY not in record.read_text()
        codec = EncryptionCodec({"k1": base64.b64decode(KEY)}, "k1")
        body = body_of(await codec.encode(PLAIN))
        answer = await http("POST", f"{url}/decode", body, Origin=info.ui_url or "", **bearer())
        assert answer.status == 200 and payloads_of(answer) == PLAIN

        # Same settings: the running one is reused.
        await ensure_background_codec_server(settings, config, ui_origin=info.ui_url)
        assert json.loads(record.read_text())["pid"] == first
        # A new token: it is replaced, and the old token stops working.
        new_token = "rotated-token-" + "9" * 16
        monkeypatch.setenv("TURNKEEP_TEST_TOKEN", new_token)
        await ensure_background_codec_server(load_settings(config), config, ui_origin=None)
        assert json.loads(record.read_text())["pid"] != first
        assert (await http("POST", f"{url}/decode", body, **bearer())).status == 401
        assert (await http("POST", f"{url}/decode", body, **bearer(new_token))).status == 200
    finally:
        assert stop_background_codec_server()
        stop_background_server()
    with pytest.raises(OSError):
        await http("POST", f"{url}/decode", body, **bearer())
