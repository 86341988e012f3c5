"""turnkeep's state directory: the embedded server's database, log and records, and by default
stored payloads."""

from __future__ import annotations

import os
from pathlib import Path


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
    So only its owner may enter it (0700), even if it already existed."""
    path = state_home()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path
