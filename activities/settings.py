"""The worker's configuration schema (``turnkeep.yaml``).

It accepts fast-agent's keys (``default_model``, ``mcp.servers``, ``anthropic``, ``openai``,
``generic``) and adds ``agents`` and ``function_tools``. Everything a turn may touch — processes,
URLs, files, credentials — is named here and only here; turn input can only pick an agent.
Loading the YAML (``${VAR}`` expansion, secrets file) is ``worker/config.py``'s job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from workflows.activity_io import HookPoint
from workflows.turn_io import DEFAULT_MAX_ITERATIONS, TurnOverrides


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class McpServerSettings(_Settings):
    """One entry of fast-agent's ``mcp.servers``."""

    transport: Literal["stdio", "http", "sse"] | None = None  # inferred when omitted
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: Path | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    description: str | None = None
    # Seconds to wait for the server to start and answer `initialize`.
    init_timeout: float = 30.0

    @model_validator(mode="after")
    def _infer_transport(self) -> McpServerSettings:
        if self.transport is None:
            self.transport = "stdio" if self.command else "http"
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio MCP server needs `command`")
        if self.transport in ("http", "sse") and not self.url:
            raise ValueError(f"an {self.transport} MCP server needs `url`")
        return self


class McpSettings(_Settings):
    servers: dict[str, McpServerSettings] = Field(default_factory=dict)


class ProviderSettings(_Settings):
    """fast-agent's ``anthropic:`` / ``openai:`` / ``generic:`` blocks."""

    api_key: SecretStr | None = None
    base_url: str | None = None
    default_headers: dict[str, str] | None = None


class TimeoutSettings(_Settings):
    start_to_close: float = 600.0
    # Activities beat every third of this, so a dead worker's call is retried, and a
    # cancelled one stops, within about this many seconds rather than after start_to_close.
    heartbeat: float | None = 10.0
    max_attempts: int = 5


class CompactionSettings(_Settings):
    """Mid-turn compaction (SPEC §6): summarise older exchanges before a follow-up model call
    once the estimated context reaches ``threshold`` of the model's window."""

    enabled: bool = True
    threshold: float = Field(default=0.85, gt=0, le=1)
    keep_exchanges: int = Field(default=2, ge=0)
    # The model's context window in tokens; known models have a default (activities/models.py).
    context_window: int | None = Field(default=None, gt=0)


class PayloadStorageSettings(_Settings):
    """Where payloads above ``threshold_bytes`` go instead of the workflow history: Temporal's
    external payload storage (``activities/payload_storage.py``). Every client and worker of a
    task queue must use the same storage, or one cannot read what another wrote."""

    # local: files in `path` (client and workers on one machine, or a shared filesystem);
    # s3: `bucket` (needs `pip install "temporalio[aioboto3]"`); off: payloads stay inline and a
    # turn whose result passes Temporal's 2 MB limit fails with an error saying so.
    driver: Literal["local", "s3", "off"] = "local"
    # Default: <state dir>/payloads, the state dir being $TURNKEEP_STATE_DIR, else
    # $XDG_STATE_HOME/turnkeep, else ~/.local/state/turnkeep. Relative paths: from the file.
    path: Path | None = None
    # Payloads of at least this many bytes are stored externally. Below Temporal's 2 MB limit.
    threshold_bytes: int = Field(default=256 * 1024, ge=0, lt=2 * 1024 * 1024)
    bucket: str | None = None
    # Prepended to every object key. Changing it makes earlier references unreadable.
    prefix: str = ""

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> PayloadStorageSettings:
        if self.driver == "s3" and not self.bucket:
            raise ValueError("payload_storage.driver 's3' needs `bucket`")
        return self


ALL_OVERRIDES = frozenset(TurnOverrides.model_fields) - {"model"}


class AgentSettings(_Settings):
    model: str | None = None  # falls back to default_model
    instruction: str | None = None
    servers: list[str] = Field(default_factory=list)
    # fast-agent's tool filter: server -> tool names (fnmatch patterns) the agent may see.
    tools: dict[str, list[str]] | None = None
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    use_history: bool = True
    parallel_tool_calls: bool = True
    temperature: float | None = None
    max_tokens: int | None = None
    # Which TurnInput overrides a turn may set. `model` is governed by `models` instead.
    overrides: list[str] = Field(default_factory=lambda: sorted(ALL_OVERRIDES))
    # Model strings a turn may ask for instead of `model`.
    models: list[str] = Field(default_factory=list)
    # Scripted assistant messages for the `playback` model (a JSON file).
    playback: Path | None = None
    # Hook names (from the top-level `hooks`) to run at each of fast-agent's hook points.
    hooks: dict[HookPoint, list[str]] = Field(default_factory=dict)
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)
    llm_timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    tool_timeouts: TimeoutSettings = Field(
        default_factory=lambda: TimeoutSettings(start_to_close=300.0, max_attempts=3)
    )

    @model_validator(mode="after")
    def _known_overrides(self) -> AgentSettings:
        unknown = set(self.overrides) - ALL_OVERRIDES
        if unknown:
            raise ValueError(
                f"unknown override(s) {sorted(unknown)}; choose from {sorted(ALL_OVERRIDES)}"
            )
        return self


class Settings(_Settings):
    default_model: str | None = None
    task_queue: str = "turnkeep"
    mcp: McpSettings = Field(default_factory=McpSettings)
    # server name -> "package.module:function" import paths, served by an in-process FastMCP
    # server under that name.
    function_tools: dict[str, list[str]] = Field(default_factory=dict)
    # hook name -> "package.module:function"; agents enable hooks by name per hook point.
    hooks: dict[str, str] = Field(default_factory=dict)
    agents: dict[str, AgentSettings] = Field(default_factory=dict)
    # Tool results above this many bytes are truncated with a visible note, so one huge result
    # cannot push a workflow payload past Temporal's 2 MB limit.
    max_tool_result_bytes: int = 256 * 1024
    # Large payloads (tool results, the turn's result) in external storage, not in history.
    payload_storage: PayloadStorageSettings = Field(default_factory=PayloadStorageSettings)
    anthropic: ProviderSettings | None = None
    openai: ProviderSettings | None = None
    generic: ProviderSettings | None = None
    # Where relative paths in the file (cwd, playback) are resolved from.
    base_dir: Path = Field(default_factory=Path.cwd, exclude=True)

    def unknown_servers(self, known: set[str]) -> dict[str, list[str]]:
        """Per agent, the servers it names that are not among ``known``."""
        return {
            name: missing
            for name, agent in self.agents.items()
            if (missing := [s for s in agent.servers if s not in known])
        }

    def unknown_hooks(self, known: set[str]) -> dict[str, list[str]]:
        """Per agent, the hooks it enables that are not among ``known``."""
        return {
            name: missing
            for name, agent in self.agents.items()
            if (missing := sorted({h for hs in agent.hooks.values() for h in hs} - known))
        }

    def path(self, p: Path) -> Path:
        return p if p.is_absolute() else self.base_dir / p
