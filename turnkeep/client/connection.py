"""Connecting to Temporal the way Temporal's own tools do (``temporalio.envconfig``):
TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TLS settings and config-file profiles,
with explicit arguments winning."""

from __future__ import annotations

import os
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
    except RuntimeError as err:  # what the SDK raises when it cannot connect
        raise TemporalUnreachableError(
            f"Cannot reach the Temporal server at {config['target_host']} "
            f"(namespace {config.get('namespace', 'default')}): {err}. Is it running, and is "
            "that its address? (`turnkeep run` without --address or TEMPORAL_ADDRESS uses "
            "turnkeep's own embedded server.)"
        ) from err


class TemporalUnreachableError(RuntimeError):
    """The Temporal frontend could not be reached (wrong address, server down, TLS mismatch)."""
