"""The wheel, as a user installs it, inside someone else's Temporal app (#22's proof).

The wheel is built from this tree and installed into a fresh venv, next to a copy of
``examples/app/``: an app with its own ``workflows.py``, ``activities.py``, ``worker.py`` and
payload codec. Its worker (``TurnkeepPlugin`` beside its own workflow and activity) runs its
workflow, which runs turns as child workflows with a function tool the app defines, against
the test session's dev server.

To stay quick, the fresh venv gets the wheel alone (``--no-deps``) and sees the test venv's
dependencies through a ``.pth`` path line: Python adds that directory to ``sys.path`` without
processing the ``.pth`` files in it, so the test venv's editable turnkeep stays invisible (the
test checks which turnkeep the app imports)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.conftest import eventually
from turnkeep.devserver.embedded import ServerInfo

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "app"


def run(*argv: str | Path, **kwargs: object) -> str:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=300, check=False, **kwargs
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Without build isolation: hatchling comes from the test venv (the `test` extra), not a
    # download per run.
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run(*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, ROOT)
    [built] = out.glob("turnkeep-*.whl")
    return built


@pytest.fixture(scope="module")
def python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv's interpreter with the wheel installed, and the test venv's dependencies."""
    home = tmp_path_factory.mktemp("venv")
    venv.create(home, with_pip=False)
    python = home / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", python]
    run(*pip, "install", "--no-deps", "-q", wheel)
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (Path(site.strip()) / "test-venv-dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8"
    )
    return python


def app_env(temporal: ServerInfo, state: Path) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        # Offline (passthrough model), and nothing of this checkout on the path.
        if name not in {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "PYTHONPATH", "TURNKEEP_CONFIG"}
    }
    return {**env, "TEMPORAL_ADDRESS": temporal.address, "TURNKEEP_STATE_DIR": str(state)}


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """The example app, copied away from this checkout."""
    target = tmp_path / "app"
    shutil.copytree(APP, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def test_the_wheel_holds_only_turnkeep(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/")[0] for name in archive.namelist()}
    [dist_info] = top - {"turnkeep"}
    assert top == {"turnkeep", dist_info}
    assert re.fullmatch(r"turnkeep-[\w.]+\.dist-info", dist_info)


def test_the_wheel_carries_the_web_page(wheel: Path) -> None:
    """The gateway's page is package data, not Python: the wheel must still hold it."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    static = "turnkeep/doors/web/static"
    assert {f"{static}/index.html", f"{static}/app.js", f"{static}/web.css"} <= names


@pytest.fixture
def worker(python: Path, app: Path, temporal: ServerInfo, tmp_path: Path) -> Iterator[Path]:
    """The app's worker, running from the wheel; yields its log."""
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [python, "worker.py"],
            cwd=app,
            env=app_env(temporal, tmp_path / "state"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield log
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_an_app_runs_turns_from_the_wheel(
    python: Path, app: Path, worker: Path, temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    env = app_env(temporal, tmp_path / "state")
    # The lazy names read each package's stub, which the wheel must carry.
    check = (
        "import turnkeep.in_workflow; turnkeep.TurnInput; "
        "import turnkeep.testing; turnkeep.testing.FakeModel; print(turnkeep.__file__)"
    )
    imported = run(python, "-c", check, cwd=app, env=env)
    assert Path(imported.strip()).is_relative_to(python.parent.parent)
    await eventually(lambda: "polling" in worker.read_text(), "the app's worker polls")

    out = run(python, "starter.py", cwd=app, env=env)
    # The research turn called the app's function tool; the app's activity saved its answer.
    assert "findings: Paris has 2,102,650 inhabitants (INSEE, 2023)." in out
    assert "note:     saved 6 words to research-notes.md" in out
    assert (app / "research-notes.md").read_text() == (
        "- Paris has 2,102,650 inhabitants (INSEE, 2023).\n"
    )
    assert "summary:  Summarise in one sentence:\nParis has 2,102,650" in out

    # The app's workflow and its two turns, every payload through the app's own codec.
    [workflow_id] = re.findall(r"^workflow: (\S+)$", out, re.MULTILINE)
    parent = [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]
    children = [
        e.start_child_workflow_execution_initiated_event_attributes
        for e in parent
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert [c.workflow_type.name for c in children] == ["TurnWorkflow", "TurnWorkflow"]
    inputs = [parent[0].workflow_execution_started_event_attributes.input]
    inputs += [c.input for c in children]
    assert {p.metadata["encoding"] for i in inputs for p in i.payloads} == {b"binary/zlib"}
