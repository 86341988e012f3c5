"""``turnkeep.support.loopback.is_loopback``: the one answer to "is this host this machine"."""

from __future__ import annotations

import pytest

from turnkeep.support.loopback import is_loopback


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST", "localhost.", " localhost ", "127.0.0.1", "127.8.9.1", "::1"]
)
def test_this_machine(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "192.168.1.2", "example.com", "localhost.example.com", "[::1]", ""]
)
def test_any_other_host(host: str) -> None:
    """A name other than localhost is not loopback whatever it resolves to now."""
    assert not is_loopback(host)
