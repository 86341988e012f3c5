"""Large payloads outside the workflow history: Temporal's external payload storage.

Temporal refuses any payload over 2 MB (a workflow task that tries to record one fails and is
retried for ever) and warns long before that. With external storage, the data converter writes
every payload of at least ``payload_storage.threshold_bytes`` to a storage driver and records
only a small reference in the history; whoever decodes the reference — a worker replaying the
turn, a client reading its result — fetches the payload back through the same driver.

Drivers:

- ``local`` (the default): ``LocalDirectoryDriver`` (``.local``), one file per payload in a
  directory, named by the SHA-256 of its bytes; ``.sweep`` deletes the files nobody uses any
  more (``turnkeep.payloads.gc`` decides which are in use, and when);
- ``s3``: the SDK's ``S3StorageDriver`` (``.s3``); a bucket lifecycle rule expires its objects;
- ``off``: payloads stay inline.

This module turns ``payload_storage`` into the ``ExternalStorage`` that clients and workers
share. The SDK marks this API experimental; this package is the one place that touches it.
"""

from __future__ import annotations

import os
from pathlib import Path

from temporalio.converter import ExternalStorage, StorageDriver

from turnkeep.config.paths import state_home
from turnkeep.config.settings import PayloadStorageSettings
from turnkeep.payloads.storage.local import LocalDirectoryDriver
from turnkeep.payloads.storage.s3 import s3_driver


def payload_directory(config: PayloadStorageSettings, base_dir: Path | None = None) -> Path:
    """Where the ``local`` driver keeps payloads: ``config.path`` (relative to ``base_dir``,
    the config file's directory, when given), else ``<state dir>/payloads``."""
    if config.path is None:
        path = state_home() / "payloads"
    else:
        # An absolute path stays as it is.
        path = config.path.expanduser() if base_dir is None else base_dir / config.path.expanduser()
    return Path(os.path.abspath(path))


def external_storage(
    config: PayloadStorageSettings, base_dir: Path | None = None
) -> ExternalStorage | None:
    """The ``ExternalStorage`` that ``payload_storage`` describes; ``None`` when it is off.
    ``base_dir``: what a relative ``path`` is relative to (the config file's directory)."""
    driver: StorageDriver
    if config.driver == "off":
        return None
    if config.driver == "local":
        driver = LocalDirectoryDriver(
            payload_directory(config, base_dir), retention=config.retention
        )
    else:
        assert config.bucket  # the settings validator requires it
        driver = s3_driver(config.bucket, config.prefix)
    return ExternalStorage(drivers=[driver], payload_size_threshold=config.threshold_bytes)


def describe_storage(storage: ExternalStorage | None) -> str:
    """Where ``storage`` puts payloads, in words (for errors about mismatched storage)."""
    if storage is None:
        return "no external payload storage"
    where = ", ".join(_location(d) or f"{d.type()} driver {d.name()!r}" for d in storage.drivers)
    return f"{where} (payloads from {storage.payload_size_threshold:,} bytes)"


def same_storage(a: ExternalStorage | None, b: ExternalStorage | None) -> bool:
    """Whether what one writes the other can read: the same object, or drivers built here for
    the same place with the same threshold. Drivers of unknown kinds only match themselves."""
    if a is b:
        return True
    if a is None or b is None or a.payload_size_threshold != b.payload_size_threshold:
        return False
    places_a = [(d.name(), _location(d)) for d in a.drivers]
    places_b = [(d.name(), _location(d)) for d in b.drivers]
    return places_a == places_b and all(place for _, place in places_a)


def _location(driver: StorageDriver) -> str | None:
    location = getattr(driver, "location", None)
    return location if isinstance(location, str) else None
