"""A fast-agent project runs on turnkeep as it is: its config files found by fast-agent's names
and rules (upward from a nested working directory, its secrets file merged over them, `${VAR}`
expanded), every fast-agent key accepted (console keys named once as ignored, unknown keys
refused by name), `mcp.targets` parsed and named as fast-agent does, and its agents declared
the fast-agent way. Real stdio and HTTP MCP servers, the real OpenAI SDK against the fake API,
the real Temporal test server, in process and through the CLI."""

from __future__ import annotations

import asyncio
import logging
import re
import stat
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.conftest import HarnessFactory, turnkeep
from tests.mcp_servers.launch import STDIO_SCRIPT, http_server
from turnkeep import Agent, RequestParams, TurnInput, TurnResult, build_worker, start_turn
from turnkeep.config.files import ConfigError, load_settings
from turnkeep.config.settings import Settings
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.fastagent.app import FastAgent
from turnkeep.fastagent.targets import target_settings
from turnkeep.testing.fake_api import FakeModelApi, Reply

# A fast-agent configuration in the shape of fast-agent's own examples: console keys, servers of
# each transport in both of fast-agent's spellings (`mcp.servers` and `mcp.targets`), `${VAR}`s.
CONFIG = """\
default_model: openai.test-model
execution_engine: asyncio
logger:
  type: file
  level: error
  progress_display: true
  show_chat: true
  show_tools: true
  truncate_tools: true
mcp_timeline:
  steps: 20
  step_seconds: 30
skills:
  directories: [".fast-agent/skills"]
shell_execution:
  timeout_seconds: 90
openai:
  base_url: "${FAKE_OPENAI_URL}"
mcp:
  targets:
    - "${PROJECT}/bin/run-tools --quiet"
    - "${REMOTE_URL}"
    - target: "${PYTHON} ${TOOLS}"
      name: calc
  servers:
    local:
      transport: stdio
      command: "${PYTHON}"
      args: ["${TOOLS}"]
      env:
        TURNKEEP_TEST_RECORD: "${PROJECT}/record.txt"
      roots:
        - uri: "file://${PROJECT}"
          name: project
      read_timeout_seconds: 120
    remote:
      transport: http
      url: "${REMOTE_URL}"
      headers:
        X-Team: "${TEAM:platform}"
      auth:
        oauth: false
      elicitation:
        mode: forms
"""

# Keys and a token kept out of the main file, as fast-agent users do.
SECRETS = """\
openai:
  api_key: sk-test-secret
mcp:
  servers:
    remote:
      access_token: remote-token
"""

IGNORED = [
    "execution_engine",
    "logger",
    "mcp_timeline",
    "shell_execution",
    "skills",
    "mcp.servers.local.roots",
    "mcp.servers.remote.auth",
]


def project(root: Path, remote_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fast-agent project under ``root``; returns a directory two levels below it."""
    (root / "bin").mkdir(parents=True)
    launcher = root / "bin" / "run-tools"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STDIO_SCRIPT}"\n', encoding="utf-8")
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    (root / "fastagent.config.yaml").write_text(CONFIG, encoding="utf-8")
    (root / "fastagent.secrets.yaml").write_text(SECRETS, encoding="utf-8")
    for name, value in {
        "PROJECT": str(root),
        "PYTHON": sys.executable,
        "TOOLS": str(STDIO_SCRIPT),
        "REMOTE_URL": remote_url,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TURNKEEP_CONFIG", raising=False)
    monkeypatch.delenv("FAST_AGENT_HOME", raising=False)
    nested = root / "src" / "app"
    nested.mkdir(parents=True)
    return nested


def remote_name(url: str) -> str:
    """fast-agent's name for a loopback URL target: host, port and path."""
    port = url.split(":")[2].split("/")[0]
    return f"127_0_0_1_{port}_mcp"


async def test_a_fast_agent_project_is_found_upward_and_runs_a_turn(
    client: Client,
    fake: FakeModelApi,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with http_server() as url:
        root = tmp_path / "project"
        monkeypatch.chdir(project(root, url, monkeypatch))
        monkeypatch.setenv("FAKE_OPENAI_URL", fake.base_url_openai)
        settings = load_settings()

        assert settings.config_file == root / "fastagent.config.yaml"
        assert settings.ignored_keys == IGNORED
        assert settings.base_dir == root
        servers = settings.mcp.servers
        remote = remote_name(url)
        assert sorted(servers) == sorted(["run-tools", remote, "calc", "local", "remote"])
        assert servers["run-tools"].command == str(root / "bin" / "run-tools")
        assert servers["run-tools"].args == ["--quiet"]
        assert (servers[remote].transport, servers[remote].url) == ("http", url)
        assert servers["local"].read_timeout_seconds == 120
        # The secrets file's token became the header fast-agent makes of it.
        assert servers["remote"].headers == {
            "X-Team": "platform",
            "Authorization": "Bearer remote-token",
        }
        # fast-agent's elicitation block is read (docs/elicitation.md), not ignored.
        elicitation = servers["remote"].elicitation
        assert elicitation is not None and elicitation.mode == "forms"
        assert settings.openai is not None and settings.openai.api_key is not None
        assert settings.openai.api_key.get_secret_value() == "sk-test-secret"

        # The agent, as fast-agent declares it.
        fast = FastAgent("fast-agent example")

        @fast.agent(
            name="helper",
            instruction="Use the tools.",
            servers=["run-tools", remote, "calc", "local", "remote"],
            request_params=RequestParams(maxTokens=512, max_iterations=5),
        )
        async def main() -> None: ...

        fake.script(
            Reply.tool_calls(
                ("c1", "run-tools__add", {"a": 2, "b": 3}),
                ("c2", f"{remote}__echo", {"text": "over http"}),
                ("c3", "calc__add", {"a": 10, "b": 20}),
                ("c4", "local__record", {"tag": "from-local"}),
                ("c5", "remote__echo", {"text": "with a token"}),
            ),
            Reply.text("all done"),
            api="openai",
        )
        task_queue = f"fa-{uuid.uuid4().hex[:10]}"
        caplog.set_level(logging.INFO, logger="turnkeep.config.files")
        async with build_worker(client, settings, agents=fast.agents, task_queue=task_queue):
            handle = await start_turn(
                client, TurnInput(agent="helper", messages=["go"]), task_queue=task_queue
            )
            result = await handle.result()

    texts = {cid: r.text for m in result.messages for cid, r in (m.tool_results or {}).items()}
    assert texts == {
        "c1": "5",
        "c2": "over http",
        "c3": "30",
        "c4": "from-local",
        "c5": "with a token",
    }
    assert (root / "record.txt").read_text(encoding="utf-8") == "from-local\n"
    assert result.final is not None and result.final.text == "all done"
    first = fake.requests_for("openai")[0]
    assert first.headers["authorization"] == "Bearer sk-test-secret"
    assert first.body["max_completion_tokens"] == 512

    lines = [r.getMessage() for r in caplog.records if r.name == "turnkeep.config.files"]
    assert f"configuration: {root / 'fastagent.config.yaml'}" in lines
    ignored = [line for line in lines if "fast-agent keys turnkeep ignores" in line]
    assert ignored == [
        f"{root / 'fastagent.config.yaml'}: fast-agent keys turnkeep ignores: " + ", ".join(IGNORED)
    ]


@pytest.mark.slow
async def test_the_cli_finds_the_project_from_a_nested_directory(
    temporal: ServerInfo,
    fake: FakeModelApi,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with http_server() as url:
        root = tmp_path / "project"
        nested = project(root, url, monkeypatch)
        monkeypatch.setenv("FAKE_OPENAI_URL", fake.base_url_openai)
        # turnkeep keys beside fast-agent's: this test's own task queue, and an agent (a
        # fast-agent file declares none; without one, turnkeep's default agent has no servers).
        config = root / "fastagent.config.yaml"
        config.write_text(
            f"task_queue: fa-cli-{uuid.uuid4().hex[:8]}\n"
            f"agents:\n  default:\n    servers: [calc, {remote_name(url)}]\n" + config.read_text(),
            encoding="utf-8",
        )
        fake.script(
            Reply.tool_calls(
                ("c1", "calc__add", {"a": 4, "b": 5}),
                ("c2", f"{remote_name(url)}__echo", {"text": "remote"}),
            ),
            Reply.text("nine"),
            api="openai",
        )
        done = await asyncio.to_thread(
            turnkeep, "run", "add 4 and 5", "--worker", "--json", temporal=temporal, cwd=nested
        )

    assert done.returncode == 0, done.stderr
    result = TurnResult.model_validate_json(done.stdout)  # with --json, the result alone
    texts = {cid: r.text for m in result.messages for cid, r in (m.tool_results or {}).items()}
    assert texts == {"c1": "9", "c2": "remote"}
    assert result.final is not None and result.final.text == "nine"
    assert done.stderr.count("fast-agent keys turnkeep ignores") == 1, done.stderr
    assert ", ".join(IGNORED) in done.stderr


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_newer_names_the_home_directory_and_ambiguity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNKEEP_CONFIG", raising=False)
    monkeypatch.delenv("FAST_AGENT_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "fast-agent.yaml", "default_model: passthrough\n")
    write(tmp_path / "fast-agent.secrets.yaml", "anthropic:\n  api_key: from-secrets\n")
    settings = load_settings()
    assert settings.config_file == tmp_path / "fast-agent.yaml"
    assert settings.anthropic is not None and settings.anthropic.api_key is not None
    assert settings.anthropic.api_key.get_secret_value() == "from-secrets"

    # fast-agent's home (./.fast-agent, or $FAST_AGENT_HOME) comes before the directory.
    write(tmp_path / ".fast-agent" / "fast-agent.config.yaml", "default_model: home\n")
    assert load_settings().default_model == "home"
    write(tmp_path / "elsewhere" / "fastagent.config.yaml", "default_model: elsewhere\n")
    monkeypatch.setenv("FAST_AGENT_HOME", str(tmp_path / "elsewhere"))
    assert load_settings().default_model == "elsewhere"

    # turnkeep.yaml wins over fast-agent's files.
    write(tmp_path / "turnkeep.yaml", "default_model: turnkeep\n")
    assert load_settings().default_model == "turnkeep"
    (tmp_path / "turnkeep.yaml").unlink()

    # Two of fast-agent's names in one directory: which one wins would be a guess.
    write(tmp_path / "elsewhere" / "fast-agent.yaml", "default_model: other\n")
    with pytest.raises(ConfigError, match=r"fast-agent\.yaml, fastagent\.config\.yaml"):
        load_settings()


def test_unknown_keys_are_errors_that_name_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNKEEP_CONFIG", raising=False)
    base = "mcp_ui_mode: auto\nlogger:\n  level: info\n"
    for text, key in [
        (base + "loggr:\n  level: info\n", "loggr"),
        (
            base + "mcp:\n  servers:\n    fs:\n      command: x\n      read_timout: 5\n",
            "read_timout",
        ),
        (base + "mcp:\n  servrs: {}\n", "servrs"),
    ]:
        path = write(tmp_path / "fastagent.config.yaml", text)
        with pytest.raises(ConfigError) as caught:
            load_settings(path)
        assert key in str(caught.value)
        assert "mcp_ui_mode" not in str(caught.value) and "logger" not in str(caught.value)

    # Provider blocks: a provider turnkeep lacks, and keys of one it has that it does not use.
    accepted = Settings.model_validate(
        {
            "bedrock": {"region": "us-east-1"},
            "anthropic": {"api_key": "k", "cache_diagnostics": True},
        }
    )
    assert accepted.ignored_keys == ["bedrock", "anthropic.cache_diagnostics"]
    with pytest.raises(ValueError, match="cache_diagnostcs"):
        Settings.model_validate({"anthropic": {"cache_diagnostcs": True}})

    path = write(
        tmp_path / "fastagent.config.yaml",
        "mcp:\n  servers:\n    hosted:\n      management: provider\n      url: https://x.example/mcp\n",
    )
    with pytest.raises(ConfigError, match="provider-managed"):
        load_settings(path)


@pytest.mark.parametrize(
    ("target", "name", "settings"),
    [
        ("uvx mcp-server-fetch", "mcp-server-fetch", {"command": "uvx"}),
        ("uvx --from git+https://x/y.git my-tool", "my-tool", {"command": "uvx"}),
        (
            "npx -y @modelcontextprotocol/server-filesystem /srv",
            "server-filesystem",
            {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv"]},
        ),
        (
            "@scope/pkg@1.2.3 --flag",
            "pkg",
            {"command": "npx", "args": ["@scope/pkg@1.2.3", "--flag"]},
        ),
        (
            "'/opt/My Tools/run.sh' -v",
            "run-sh",
            {"command": "/opt/My Tools/run.sh", "args": ["-v"]},
        ),
        (
            "https://hf.co/mcp?login",
            "hf_co",
            {"transport": "http", "url": "https://hf.co/mcp?login"},
        ),
        (
            "https://api.example.com/v1",
            "api_example_com",
            {"transport": "http", "url": "https://api.example.com/v1/mcp"},
        ),
        (
            "https://mcp.very-long-hostname.example.org/sse",
            "mcp_very_e_org",
            {"transport": "sse", "url": "https://mcp.very-long-hostname.example.org/sse"},
        ),
        (
            "http://localhost:8001/tools/mcp",
            "localhost_8001_tools_mcp",
            {"transport": "http", "url": "http://localhost:8001/tools/mcp"},
        ),
    ],
)
def test_targets_are_parsed_and_named_as_fast_agent_does(
    target: str, name: str, settings: dict[str, Any]
) -> None:
    derived, resolved = target_settings(target)
    assert derived == name
    assert {key: resolved[key] for key in settings} == settings


def test_target_forms_in_the_settings() -> None:
    settings = Settings.model_validate(
        {
            "mcp": {
                "targets": ["uvx mcp-server-fetch", {"target": "uvx mcp-server-fetch"}],
                # fast-agent 0.10's spelling: a target per named server, other keys beside it.
                "servers": {"web": {"target": "https://h.example.com/mcp", "headers": {"A": "b"}}},
            }
        }
    )
    assert sorted(settings.mcp.servers) == ["mcp-server-fetch", "web"]
    assert settings.mcp.servers["web"].headers == {"A": "b"}
    # A local URL is named by host, port and path, /mcp included; with no path (a query keeps
    # /mcp from being added), by a hash of itself, as fast-agent does.
    assert target_settings("http://127.0.0.1:9000")[0] == "127_0_0_1_9000_mcp"
    hashed, _ = target_settings("http://127.0.0.1:9000?k=v")
    assert re.fullmatch(r"127_0_0_1_9000_[0-9a-f]{8}", hashed)
    with pytest.raises(ValueError, match="duplicate server name 'mcp-server-fetch'"):
        Settings.model_validate(
            {"mcp": {"targets": ["uvx mcp-server-fetch", "uvx mcp-server-fetch --other"]}}
        )
    with pytest.raises(ValueError, match="must be a pure URL"):
        target_settings("https://h.example.com/mcp --auth x")


def test_request_params_map_onto_the_agent_or_are_refused() -> None:
    fast = FastAgent("app", parse_cli_args=False, quiet=True)

    @fast.agent(
        "writer",
        "Write briefly.",
        servers=["fs"],
        tools={"fs": ["read_*"]},
        model="openai.gpt-4.1",
        use_history=False,
        request_params=RequestParams(
            maxTokens=300, max_iterations=7, parallel_tool_calls=False, temperature=0.1
        ),
    )
    async def writer() -> None: ...

    @fast.tool
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    (agent,) = fast.agents
    assert agent.instruction == "Write briefly."
    assert agent.tools == ["fs", shout]
    assert agent.tool_filter == {"fs": ["read_*"]}
    assert (agent.model, agent.use_history, agent.max_tokens) == ("openai.gpt-4.1", False, 300)
    assert (agent.max_iterations, agent.parallel_tool_calls, agent.temperature) == (7, False, 0.1)

    with pytest.raises(ValueError, match=r"RequestParams\.top_p is not supported"):
        RequestParams(topP=0.5)
    with pytest.raises(ValueError, match=r"RequestParams\.response_format is not supported"):
        RequestParams(response_format={"type": "json_object"})
    # Ignored fields are accepted; refused ones are accepted at fast-agent's default.
    RequestParams(template_vars={"x": 1}, streaming_timeout=30, tool_result_mode="postprocess")
    with pytest.raises(ValueError, match="max_tokens differs"):
        Agent(name="other", max_tokens=5, request_params=RequestParams(maxTokens=6))
    with pytest.raises(ValueError, match=r"human_input=\.\.\.\) is not supported"):
        fast.agent("console", human_input=True)
    with pytest.raises(NotImplementedError, match="custom agent classes"):
        fast.custom(object, name="c")
    with pytest.raises(NotImplementedError, match=r"fast\.run"):
        fast.run()


async def test_read_timeout_seconds_bounds_a_tool_call(harness: HarnessFactory) -> None:
    server = {"command": sys.executable, "args": [str(STDIO_SCRIPT)]}
    async with harness(
        mcp={"servers": {"slowpoke": {**server, "read_timeout_seconds": 1}}},
        agents={"test": {"model": "passthrough", "servers": ["slowpoke"]}},
    ) as h:
        result = await h.run('***CALL_TOOL slowpoke__slow {"seconds": 600}')
    (answer,) = [r for m in result.messages for r in (m.tool_results or {}).values()]
    # Answered as an error the model can act on, long before the tool would have finished.
    assert answer.is_error, answer
    assert "slept" not in answer.text
