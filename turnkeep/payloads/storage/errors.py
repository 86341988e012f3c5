"""What can go wrong with externally stored payloads (and the stored conversations beside them)."""

from __future__ import annotations


class PayloadStorageError(RuntimeError):
    """A stored payload could not be written or read back."""


class MissingPayloadError(PayloadStorageError):
    """A history references a payload that is not in the storage directory."""


class PayloadExpiredError(MissingPayloadError):
    """A missing payload that was stored longer than ``payload_storage.retention`` ago, so the
    sweep removed it (rather than a misconfigured ``payload_storage.path``)."""


class PayloadStorageConfigError(ValueError):
    """``payload_storage`` names a driver this installation cannot provide."""
