"""turnkeep's state directory: the embedded server's database, log and records, and by default
stored payloads."""

from __future__ import annotations

import os
from pathlib import Path

# What turnkeep keeps on disk may hold conversations (stored payloads, the dev server's database,
# logs and records), so it is its owner's only; a process it starts runs under a umask of
# GROUP_AND_OTHER_BITS, so that what the process creates is too.
OWNER_ONLY_DIR_MODE = 0o700
OWNER_ONLY_FILE_MODE = 0o600
GROUP_AND_OTHER_BITS = 0o077


def state_home() -> Path:
    """turnkeep's state directory, not created: $TURNKEEP_STATE_DIR, else
    $XDG_STATE_HOME/turnkeep, else ~/.local/state/turnkeep (``state_dir()``
    creates it)."""
    # Empty variables count as unset, as the XDG spec asks.
    if explicit := os.environ.get("TURNKEEP_STATE_DIR"):
        return Path(explicit)
    if xdg := os.environ.get("XDG_STATE_HOME"):
        return Path(xdg) / "turnkeep"
    return Path.home() / ".local" / "state" / "turnkeep"


def state_dir() -> Path:
    """Where turnkeep keeps its background server's database, log and record (created), and by
    default its stored payloads: every conversation, unencrypted unless ``encryption`` is on.
    So only its owner may enter it, even if it already existed."""
    path = state_home()
    path.mkdir(mode=OWNER_ONLY_DIR_MODE, parents=True, exist_ok=True)
    if path.stat().st_mode & GROUP_AND_OTHER_BITS:
        path.chmod(OWNER_ONLY_DIR_MODE)
    return path
