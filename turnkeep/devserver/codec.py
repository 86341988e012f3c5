"""The codec server in the background, beside the embedded dev server: ``turnkeep server`` and
``turnkeep run`` start one (``turnkeep codec-server`` in a detached process) when the settings
turn encryption on, so the Web UI can show decrypted payloads; it is reused while its keys,
token, address, origins and config file are the same, and stopped with the dev server."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from turnkeep.config.settings import Settings
from turnkeep.devserver.background import BackgroundProcess, pid_alive, terminate
from turnkeep.devserver.embedded import log_tail
from turnkeep.payloads.codec import EncryptionCodec
from turnkeep.payloads.codec_server import CodecServerError, require_token, token_digest
from turnkeep.support.asgi import port_taken

# `codec-server` in its command line: the recorded pid is still `turnkeep codec-server`.
BACKGROUND = BackgroundProcess("codec-server", marker=b"codec-server")


def _fingerprint(settings: Settings, origins: Iterable[str], config: Path) -> str:
    """What a running background codec server must match to be reused: the same keys, token,
    address, origins and config file (a digest; keys and token never touch the record)."""
    assert settings.encryption is not None
    codec = EncryptionCodec.from_settings(settings.encryption)
    server = settings.encryption.codec_server
    digest = hashlib.sha256(codec.identity)
    digest.update(token_digest(require_token(settings.encryption)).encode())
    digest.update(str(server.session_lifetime.total_seconds()).encode())
    digest.update(json.dumps([server.host, server.port, sorted(origins), str(config)]).encode())
    return digest.hexdigest()


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(path))


def background_codec_server_url(settings: Settings) -> str | None:
    """The URL ``ensure_background_codec_server`` serves these settings on (without starting
    anything); ``None`` when encryption or its token is not configured."""
    if settings.encryption is None or settings.encryption.codec_server.token is None:
        return None
    server = settings.encryption.codec_server
    if server.port == 0:
        raise CodecServerError(
            "encryption.codec_server.port 0 (any free port) cannot be used for the background "
            "codec server, whose address the Web UI is started with; give a port"
        )
    return f"http://{server.host}:{server.port}"


async def ensure_background_codec_server(
    settings: Settings, config: Path, *, ui_origin: str | None
) -> str | None:
    """A detached ``turnkeep codec-server`` for ``config`` that outlives the CLI, like the
    background Temporal server; reused while its keys, token and address stay the same,
    restarted when they change. Returns its URL, or ``None`` without encryption or token.
    ``stop_background_codec_server()`` stops it (``turnkeep server --stop``)."""
    url = background_codec_server_url(settings)
    if url is None or settings.encryption is None:
        return None
    server = settings.encryption.codec_server
    origins = sorted({*server.origins, *([ui_origin] if ui_origin else [])})
    config = _absolute(config)  # the same file, whichever directory asks
    fingerprint = _fingerprint(settings, origins, config)
    async with BACKGROUND.locked():
        record = BACKGROUND.running()
        if record is not None:
            if record.get("fingerprint") == fingerprint:
                return url
            terminate(record["pid"])  # other keys, token or address: replace it
        BACKGROUND.forget()
        if port_taken(server.host, server.port):
            raise CodecServerError(
                f"port {server.port} on {server.host} (encryption.codec_server.port) is taken "
                "by something that is not turnkeep's background codec server; stop it or "
                "choose another port"
            )
        return await _start_background_codec_server(url, config, origins, fingerprint)


async def _start_background_codec_server(
    url: str, config: Path, origins: list[str], fingerprint: str
) -> str:
    log_file = BACKGROUND.new_log()
    argv = [sys.executable, "-m", "turnkeep.cli", "codec-server", "--config", str(config)]
    for origin in origins:
        argv += ["--origin", origin]
    pid = BACKGROUND.start(argv, url=url, fingerprint=fingerprint)["pid"]
    try:
        await _wait_until_serving(url, pid, log_file)
    except BaseException:
        BACKGROUND.abandon(pid)
        raise
    return url


def stop_background_codec_server() -> bool:
    """Stop the codec server ``ensure_background_codec_server`` started; False if none ran."""
    return BACKGROUND.stop()


async def _wait_until_serving(url: str, pid: int, log_file: Path, within: float = 30.0) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        if not pid_alive(pid):
            raise CodecServerError(
                f"the background codec server exited before it was ready.\n"
                f"Log ({log_file}):\n{log_tail(log_file)}"
            )
        try:
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError:
            if loop.time() > deadline:
                raise CodecServerError(
                    f"the background codec server at {url} was not ready within {within:.0f}s."
                    f"\nLog ({log_file}):\n{log_tail(log_file)}"
                ) from None
            await asyncio.sleep(0.1)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return
