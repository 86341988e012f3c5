"""fast-agent's configuration keys in a turnkeep configuration: the ones turnkeep acts on are
translated, the console and UI ones are accepted and named once as ignored, and a key
fast-agent does not have is left for ``Settings`` to refuse (``extra="forbid"``).

The key lists follow fast-agent's settings schema (``fast_agent.config``) at
``FAST_AGENT_COMMIT``, plus keys older releases had that configurations still carry
(``mcp.targets``, ``mcp_timeline``, ``mcp_ui_*``, ``auto_sampling``, ``environment_dir``...).
``mcp.targets`` (until 0.9) and ``mcp.servers.<name>.target`` (from 0.10) become servers as
fast-agent makes them (``turnkeep.fastagent.targets``).

Only keys that are not ``Settings`` fields are ignored, so a provider block another module
adds support for (``deepseek:``, ``azure:``...) is honoured from then on.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from turnkeep.fastagent.targets import server_targets, target_settings

# Top-level keys turnkeep accepts and does nothing with.
IGNORED_TOP_LEVEL: frozenset[str] = frozenset(
    {
        # console, UI and the interactive app
        "logger",
        "tui",
        "shell_execution",
        "skills",
        "cards",
        "plugins",
        "commands",
        "harness_app",
        "mcp_timeline",  # until 0.9; mcp.diagnostics.timeline since
        "mcp_ui_mode",  # until 0.9
        "mcp_ui_output_dir",  # until 0.9
        # fast-agent's runtime: its home, sessions and environments
        "home",
        "environment_dir",  # 0.6
        "environments",
        "default_environment",
        "execution_engine",
        "session_history",
        "session_history_window",
        "git_aware",
        "model_source",
        "cli_model_override",
        "model_references",
        "otel",
        "auto_sampling",  # until 0.9; mcp.client.auto_sampling since
        # turnkeep retries model calls by `agents.<name>.llm_timeouts.max_attempts`, and
        # compacts by `agents.<name>.compaction`
        "llm_retries",
        "compaction",
        # provider blocks of providers turnkeep has no provider for (yet)
        "responses",
        "openresponses",
        "codexresponses",
        "deepseek",
        "zai",
        "moonshot",
        "google",
        "xai",
        "metaai",
        "openrouter",
        "tensorzero",
        "azure",
        "aliyun",
        "bedrock",
        "hf",
        "huggingface",  # 0.2
        "groq",
    }
)

_COMMON = frozenset({"api_key", "base_url", "default_headers", "default_model"})
_RESPONSES = _COMMON | {"reasoning", "reasoning_effort", "service_tier", "transport", "web_search"}

# Each provider block's keys in fast-agent's schema. In a block turnkeep has (`anthropic:`,
# `openai:`...), those its own block lacks are accepted and ignored; the block's other keys are
# its own (``turnkeep.config.settings``).
PROVIDER_KEYS: dict[str, frozenset[str]] = {
    "anthropic": _COMMON
    | {
        "cache_mode",
        "cache_ttl",
        "cache_diagnostics",
        "reasoning",
        "task_budget",
        "structured_output_mode",
        "vertex_ai",
        "web_search",
        "web_fetch",
        "thinking_enabled",  # until 0.9; `reasoning` since
        "thinking_budget_tokens",  # until 0.9
    },
    "openai": _RESPONSES | {"text_verbosity"},
    "responses": _RESPONSES | {"text_verbosity"},
    "aliyun": _RESPONSES | {"text_verbosity"},
    "codexresponses": _RESPONSES | {"text_verbosity"},
    "openresponses": _RESPONSES,
    "deepseek": _COMMON | {"reasoning", "web_search"},
    "google": _COMMON | {"transport"},
    "xai": _COMMON
    | {
        "web_search",
        "x_search",
        "reasoning_summary",
        "stream_tool_calls",
        "image_upload_mode",
        "image_upload_ttl_seconds",
    },
    "azure": _COMMON | {"resource_name", "azure_deployment", "api_version"},
    "hf": _COMMON | {"default_provider"},
    "bedrock": frozenset({"default_model", "profile", "reasoning", "reasoning_effort", "region"}),
    **{
        name: _COMMON for name in ("generic", "groq", "openrouter", "tensorzero", "zai", "moonshot")
    },
    "metaai": _COMMON | {"web_search"},
}

# `mcp:` keys beside `servers` and `targets`.
IGNORED_MCP: frozenset[str] = frozenset({"defaults", "client", "diagnostics"})

# Per-server keys turnkeep accepts and does nothing with: OAuth and roots need a person at a
# console (`sampling` and `elicitation` are read: docs/elicitation.md); pings and reconnection
# are the tool activities' retries' job here; provider-managed hints have no meaning for a
# client-managed server.
IGNORED_SERVER: frozenset[str] = frozenset(
    {
        "auth",
        "roots",
        "ping_interval_seconds",
        "max_missed_pings",
        "http_timeout_seconds",
        "http_read_timeout_seconds",
        "read_transport_sse_timeout_seconds",
        "load_on_start",
        "include_instructions",
        "reconnect_on_disconnect",
        "implementation",
        "defer_loading",
        "experimental_session_advertise",  # 0.6
        "experimental_session_advertise_version",  # 0.6
    }
)


def accept_fast_agent_keys(data: Any, fields: Mapping[str, FieldInfo]) -> Any:
    """``data`` (a configuration mapping) with fast-agent's keys translated or set aside, the
    set-aside ones' dotted paths added to ``data["ignored_keys"]``. ``fields``: ``Settings``'
    fields. Errors name keys, never values (a value may be a secret)."""
    if not isinstance(data, dict):
        return data
    ignored: list[str] = list(data.get("ignored_keys") or [])
    out = {key: value for key, value in data.items() if key != "ignored_keys"}
    for key in sorted(IGNORED_TOP_LEVEL & out.keys() - fields.keys()):
        del out[key]
        ignored.append(key)
    for key in sorted(PROVIDER_KEYS.keys() & out.keys() & fields.keys()):
        if isinstance(out[key], dict):
            known = _model_fields(fields[key])
            block = dict(out[key])
            for sub in sorted(PROVIDER_KEYS[key] & block.keys() - known):
                del block[sub]
                ignored.append(f"{key}.{sub}")
            out[key] = block
    if isinstance(out.get("mcp"), dict):
        out["mcp"] = _mcp(out["mcp"], ignored)
    if ignored:
        out["ignored_keys"] = list(dict.fromkeys(ignored))
    return out


def _model_fields(field: FieldInfo) -> set[str]:
    """The field names of the model a settings field holds (``ProviderSettings | None``)."""
    for candidate in (field.annotation, *typing.get_args(field.annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return set(candidate.model_fields)
    return set()


def _mcp(mcp: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    out = dict(mcp)
    for key in sorted(IGNORED_MCP & out.keys()):
        del out[key]
        ignored.append(f"mcp.{key}")
    servers: dict[str, Any] = {}
    targets = out.pop("targets", None)
    if targets is not None:
        servers.update(server_targets(targets))
    raw_servers = out.get("servers")
    if isinstance(raw_servers, dict):
        servers.update(raw_servers)
    elif raw_servers is not None:
        return out  # Settings says what is wrong with it
    out["servers"] = {
        name: _server(str(name), entry, ignored) if isinstance(entry, dict) else entry
        for name, entry in servers.items()
    }
    return out


def _server(name: str, entry: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    where = f"mcp.servers.{name}"
    out = dict(entry)
    if "target" in out:
        target = out.pop("target")
        out = {**target_settings(target, f"{where}.target")[1], **out}
    # fast-agent's deprecated spelling of the map key; it must agree.
    if "name" in out and out.pop("name") != name:
        raise ValueError(f"`{where}.name` must match its map key {name!r}")
    management = out.pop("management", "client")
    if management != "client" or "connector_id" in out:
        raise ValueError(
            f"`{where}`: provider-managed MCP servers (`management: provider`, "
            "`connector_id`) are run by the model provider, which turnkeep does not do; "
            "configure the server for the worker to connect to instead"
        )
    token = out.pop("access_token", None)
    if token is not None:
        out["headers"] = _with_bearer(where, out.get("headers"), token)
    for key in sorted(IGNORED_SERVER & out.keys()):
        del out[key]
        ignored.append(f"{where}.{key}")
    return out


def _with_bearer(where: str, headers: Any, token: Any) -> dict[str, Any]:
    """fast-agent's ``access_token``: an ``Authorization: Bearer`` header."""
    if not isinstance(token, str) or not token.strip():
        raise ValueError(f"`{where}.access_token` must be a non-empty string")
    value = token.strip()
    if value[:7].lower() == "bearer ":
        value = value[7:].strip()
    merged = dict(headers) if isinstance(headers, dict) else {}
    if any(str(key).lower() == "authorization" for key in merged):
        raise ValueError(f"`{where}`: access_token cannot be combined with an Authorization header")
    merged["Authorization"] = f"Bearer {value}"
    return merged
