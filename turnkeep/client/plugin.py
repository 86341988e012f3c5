"""CLIENT_PLUGIN"""

from __future__ import annotations

from temporalio.converter import DataConverter, ExternalStorage
from temporalio.plugin import SimplePlugin

from turnkeep.config.settings import Settings
from turnkeep.payloads.codec import payload_codec
from turnkeep.payloads.composition import turnkeep_converter
from turnkeep.payloads.storage import external_storage


class TurnkeepClientPlugin(SimplePlugin):
    """For clients that start and watch turns: turnkeep's data converter, added to the
    client's own (``turnkeep.payloads.composition``), nothing else.

    Payload storage comes from ``storage`` if given, else from ``settings.payload_storage``
    (default settings when none are given: the ``local`` driver under the state directory),
    and encryption from ``settings.encryption``. A client needs the storage and keys its
    workers use, to read large results and write large inputs.
    """

    def __init__(
        self, settings: Settings | None = None, *, storage: ExternalStorage | None = None
    ) -> None:
        settings = settings or Settings()
        self.storage = (
            storage
            if storage is not None
            else external_storage(settings.payload_storage, settings.base_dir)
        )
        self.codec = payload_codec(settings.encryption)
        super().__init__("turnkeep-client", data_converter=self._converter)

    def _converter(self, existing: DataConverter | None) -> DataConverter:
        return turnkeep_converter(existing, self.storage, self.codec)
