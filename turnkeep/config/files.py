"""Loading ``turnkeep.yaml``: fast-agent's conventions for finding, expanding and merging it.

``${VAR}`` and ``${VAR:default}`` are expanded from the environment; a secrets file beside the
config (``turnkeep.secrets.yaml``) is merged over it, so keys can stay out of the main file and
out of version control. Keys only ever live here and in the environment, never in a turn.

With no ``turnkeep.yaml``, a fast-agent project's own files are found by fast-agent's names and
rules (``turnkeep.fastagent.config_files``), with its secrets file merged over them the same
way.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from turnkeep.config.problems import validation_problems, yaml_problem
from turnkeep.config.settings import AgentSettings, Settings
from turnkeep.fastagent import config_files as fast_agent_files

CONFIG_NAME = "turnkeep.yaml"
SECRETS_NAME = "turnkeep.secrets.yaml"
# The one agent of a worker that finds no config file.
BUILTIN_AGENT = "default"
log = logging.getLogger(__name__)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


class ConfigError(Exception):
    """The configuration file is missing, unreadable or invalid; each problem (a line that
    says where and what) is one of ``problems``."""

    def __init__(self, *problems: str) -> None:
        super().__init__(*problems)
        self.problems = problems

    def __str__(self) -> str:
        return "; ".join(self.problems)


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
    """An explicit path, else $TURNKEEP_CONFIG, else ./turnkeep.yaml, else fast-agent's config
    file (``turnkeep.fastagent.config_files``), else none."""
    if path is not None:
        return path
    if os.environ.get("TURNKEEP_CONFIG"):
        return Path(os.environ["TURNKEEP_CONFIG"])
    local = Path.cwd() / CONFIG_NAME
    if local.exists():
        return local
    try:
        return fast_agent_files.find_config(Path.cwd())
    except fast_agent_files.ConfigFileClash as err:
        raise ConfigError(str(err)) from err


def _secrets_for(config: Path) -> Path | None:
    """The secrets file beside a config: fast-agent's names beside a fast-agent config."""
    if fast_agent_files.is_config(config):
        try:
            return fast_agent_files.secrets_beside(config)
        except fast_agent_files.ConfigFileClash as err:
            raise ConfigError(str(err)) from err
    secrets = config.with_name(SECRETS_NAME)
    return secrets if secrets.exists() else None


def load_settings(path: Path | None = None) -> Settings:
    """The worker's settings; with no file at all, one ``default`` agent on the default model."""
    found = find_config(path)
    raw: dict[str, Any] = {}
    base_dir = Path.cwd()
    if found is not None:
        raw = _read_yaml(found)
        base_dir = found.resolve().parent
        secrets = _secrets_for(found)
        if secrets is not None:
            raw = merge(raw, _read_yaml(secrets))
    expanded = expand(raw)
    try:
        settings = Settings.model_validate(
            {
                **expanded,
                "base_dir": base_dir,
                "config_file": found.resolve() if found is not None else None,
            }
        )
    except ValidationError as err:
        source = str(found) if found is not None else "configuration"
        raise ConfigError(*validation_problems(source, err, expanded)) from err
    if not settings.agents:
        settings.agents[BUILTIN_AGENT] = AgentSettings()
    return settings


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror or err}") from err
    except yaml.YAMLError as err:
        raise ConfigError(yaml_problem(path, err)) from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    return data


def announce_configuration(config_file: Path | None, ignored_keys: list[str]) -> None:
    """A starting worker's word on its configuration: the file it came from, and in one line
    the fast-agent keys in it that turnkeep accepts but does nothing with."""
    log.info("configuration: %s", config_file or "none (defaults)")
    if ignored_keys:
        log.warning(
            "%s: fast-agent keys turnkeep ignores: %s",
            config_file or "configuration",
            ", ".join(ignored_keys),
        )
