"""Connecting to Temporal the way Temporal's own tools do (``temporalio.envconfig``):
TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TLS settings and config-file profiles,
with explicit arguments winning."""

from __future__ import annotations

import os
import re
from typing import Any

from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.envconfig import ClientConfig
from temporalio.plugin import SimplePlugin

from turnkeep.client.plugin import TurnkeepClientPlugin
from turnkeep.config.settings import Settings


def address_configured() -> bool:
    """Whether the environment names a server (else the CLI may start an embedded one)."""
    return bool(os.environ.get("TEMPORAL_ADDRESS") or os.environ.get("TEMPORAL_PROFILE"))


async def connect(
    address: str | None = None,
    namespace: str | None = None,
    *,
    profile: str | None = None,
    plugin: SimplePlugin | None = None,
    settings: Settings | None = None,
    data_converter: DataConverter | None = None,
) -> Client:
    """A client with turnkeep's data converter. ``settings`` (the workers' turnkeep.yaml) give
    it their payload storage, so it reads the large payloads they store; without them it uses
    the default storage. ``data_converter``, an application's own, keeps its payload codec
    under turnkeep's (``turnkeep.payloads.composition``). ``plugin`` replaces turnkeep's client
    plugin altogether."""
    config: dict[str, Any] = dict(ClientConfig.load_client_connect_config(profile=profile))
    if address:
        config["target_host"] = address
    if namespace:
        config["namespace"] = namespace
    config.setdefault("target_host", "localhost:7233")
    if data_converter is not None:
        config["data_converter"] = data_converter
    try:
        return await Client.connect(**config, plugins=[plugin or TurnkeepClientPlugin(settings)])
    except ValueError as err:  # an address the SDK cannot parse (a port out of range, say)
        raise TemporalUnreachableError(
            f"{config['target_host']!r} is not a server address ({err}): give it as "
            "HOST:PORT, e.g. localhost:7233"
        ) from None
    except RuntimeError as err:  # what the SDK raises when it cannot connect
        raise TemporalUnreachableError(unreachable_text(config["target_host"], str(err))) from err


# The server's answer, when something answered (a gRPC status from the SDK's core).
_STATUS = re.compile(r'Status \{ code: (\w+), message: "((?:[^"\\]|\\.)*)"')
_CHECK = (
    "check that a Temporal server runs there and that this is its address (--address, "
    "TEMPORAL_ADDRESS); without either, turnkeep uses its own embedded server"
)


def unreachable_text(address: str, raw: str) -> str:
    """Why no client could be made for ``address``, in words, with what to check: the SDK
    tells it as its Rust core's error chain (``tonic::transport::Error(...)``)."""
    lowered = raw.lower()
    status = _STATUS.search(raw)
    if "connection refused" in lowered or "connectionrefused" in lowered:
        return f"nothing answers at {address} (connection refused): {_CHECK}"
    if "dns error" in lowered or "failed to lookup address" in lowered:
        host = address.rpartition(":")[0] or address
        return f"no host is named {host!r} (its address does not resolve): {_CHECK}"
    if "timed out" in lowered or "deadline" in lowered or "timeout" in lowered:
        return f"no answer from {address} in time: {_CHECK}"
    if "tls" in lowered or "certificate" in lowered or "handshake" in lowered:
        return (
            f"the TLS handshake with {address} failed: check whether the server uses TLS and "
            "the client's TLS settings (TEMPORAL_TLS, TEMPORAL_TLS_CLIENT_CERT_PATH...)"
        )
    if status is not None and status.group(1) in ("Unauthenticated", "PermissionDenied"):
        return (
            f"the server at {address} refused the credentials ({status.group(2)}): check "
            "TEMPORAL_API_KEY or the client certificate"
        )
    if status is not None:
        return (
            f"something answers at {address}, but not as a Temporal server "
            f"({status.group(1)}: {status.group(2)}): {_CHECK}"
        )
    said = " ".join(raw.split())
    return f"cannot connect to {address}: {_CHECK} (the client said: {said})"


class TemporalUnreachableError(RuntimeError):
    """The Temporal frontend could not be reached (wrong address, server down, TLS mismatch)."""
