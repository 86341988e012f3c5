"""Whether a host is this machine: what every server that listens (the doors, the codec
server) and every host guard asks before trusting a request or warning about a bind."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, without port or brackets) is this machine's. Any
    other name is not, whatever it resolves to now: it may resolve to anything later."""
    name = host.strip().lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
