"""Loading ``turnkeep.yaml``: fast-agent's conventions for finding, expanding and merging it.

``${VAR}`` and ``${VAR:default}`` are expanded from the environment; a secrets file beside the
config (``turnkeep.secrets.yaml``) is merged over it, so keys can stay out of the main file and
out of version control. Keys only ever live here and in the environment, never in a turn.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from turnkeep.settings import AgentSettings, Settings

CONFIG_NAME = "turnkeep.yaml"
SECRETS_NAME = "turnkeep.secrets.yaml"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


class ConfigError(Exception):
    """The configuration file is missing, unreadable or invalid; the message says where."""


def expand(value: Any) -> Any:
    if isinstance(value, str):
        return _VAR.sub(_substitute, value)
    if isinstance(value, dict):
        return {key: expand(item) for key, item in value.items()}
    if isinstance(value, list):
        return [expand(item) for item in value]
    return value


def _substitute(match: re.Match[str]) -> str:
    name, default = match.group(1), match.group(2)
    if name in os.environ:
        return os.environ[name]
    if default is not None:
        return default
    raise ConfigError(f"${{{name}}} is used in the config but {name} is not set")


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def find_config(path: Path | None = None) -> Path | None:
    """An explicit path, else $TURNKEEP_CONFIG, else ./turnkeep.yaml, else none."""
    if path is not None:
        return path
    if os.environ.get("TURNKEEP_CONFIG"):
        return Path(os.environ["TURNKEEP_CONFIG"])
    local = Path.cwd() / CONFIG_NAME
    return local if local.exists() else None


def load_settings(path: Path | None = None) -> Settings:
    """The worker's settings; with no file at all, one ``default`` agent on the default model."""
    found = find_config(path)
    raw: dict[str, Any] = {}
    base_dir = Path.cwd()
    if found is not None:
        raw = _read_yaml(found)
        base_dir = found.resolve().parent
        secrets = found.with_name(SECRETS_NAME)
        if secrets.exists():
            raw = merge(raw, _read_yaml(secrets))
    try:
        settings = Settings.model_validate({**expand(raw), "base_dir": base_dir})
    except ValidationError as err:
        raise ConfigError(f"{found or 'configuration'} is invalid:\n{err}") from err
    if not settings.agents:
        settings.agents["default"] = AgentSettings()
    return settings


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    return data
