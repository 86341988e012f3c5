"""``Target``: the one way a CLI command loads its settings, connects and runs its coroutine.
The commands themselves are covered through the CLI (``test_cli_output``, ``test_cli_errors``);
these pin the helper's own promises."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from turnkeep.cli.target import Target
from turnkeep.config.files import ConfigError
from turnkeep.devserver.embedded import ServerInfo


def test_a_command_runs_its_coroutine_on_a_client_of_the_server_it_names(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    config = tmp_path / "turnkeep.yaml"
    config.write_text("agents:\n  demo:\n    model: passthrough\n", encoding="utf-8")
    target = Target.of(temporal.address, temporal.namespace, config)
    assert list(target.settings.agents) == ["demo"]

    async def namespace(client: Client) -> str:
        return client.namespace

    assert target.run(namespace) == temporal.namespace

    async def embedded(client: Client, server: ServerInfo | None) -> ServerInfo | None:
        return server

    # A server named by address is not the embedded one; no worker was asked for.
    assert target.run_with_worker(embedded, worker=False) is None


def test_a_wrong_config_is_refused_before_anything_connects(tmp_path: Path) -> None:
    config = tmp_path / "turnkeep.yaml"
    config.write_text("agents:\n  demo: {model: passthrough\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        Target.of("127.0.0.1:1", None, config)
