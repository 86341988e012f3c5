"""Where a session's stored conversation segments go, in a directory or a bucket: under a key
named for the session. Both the conversation stores (which write there) and the sweep (which
keeps a running session's key) name it the same way."""

from __future__ import annotations

import hashlib


def owner_key(owner: str) -> str:
    """Where a session's segments go: its workflow id's SHA-256 (any string is an id)."""
    return hashlib.sha256(owner.encode()).hexdigest()[:32]
