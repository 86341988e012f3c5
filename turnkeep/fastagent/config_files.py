"""fast-agent's config files, found by fast-agent's names and rules (``fast_agent.home`` at
the commit of ``FAST_AGENT_COMMIT``): ``turnkeep.config.files`` looks for them when a project
has no ``turnkeep.yaml``, and reads them as its own."""

from __future__ import annotations

import os
from pathlib import Path

# fast-agent's names, preferred first; one directory may hold only one.
CONFIG_NAMES = ("fast-agent.yaml", "fast-agent.config.yaml", "fastagent.config.yaml")
SECRETS_NAMES = ("fast-agent.secrets.yaml", "fastagent.secrets.yaml")


class ConfigFileClash(ValueError):
    """A directory holds more than one of fast-agent's names for one file: which one wins
    would be a guess, so fast-agent refuses it too."""


def find_config(cwd: Path) -> Path | None:
    """fast-agent's config file, as fast-agent finds it: in its home ($FAST_AGENT_HOME, else
    ./.fast-agent), then in the working directory, then in each directory above it (older
    fast-agent releases searched upward, and projects rely on it)."""
    cwd = cwd.resolve()
    home = Path(os.environ.get("FAST_AGENT_HOME") or ".fast-agent").expanduser()
    for directory in (cwd / home, cwd, *cwd.parents):
        found = _one_of(directory, CONFIG_NAMES)
        if found is not None:
            return found
    return None


def is_config(path: Path) -> bool:
    """Whether ``path`` is named as a fast-agent config file (its secrets go by its names)."""
    return path.name in CONFIG_NAMES


def secrets_beside(config: Path) -> Path | None:
    """The secrets file beside a fast-agent config, by fast-agent's names."""
    return _one_of(config.parent, SECRETS_NAMES)


def _one_of(directory: Path, names: tuple[str, ...]) -> Path | None:
    found = [directory / name for name in names if (directory / name).is_file()]
    if len(found) > 1:
        raise ConfigFileClash(
            f"{directory} holds {', '.join(p.name for p in found)}: keep only one of them"
        )
    return found[0] if found else None
