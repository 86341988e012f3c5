"""How turnkeep's payloads cross Temporal: the payload converter (pydantic JSON), the optional
AES-GCM codec, and external payload storage for large payloads. Clients and workers build the
same data converter from the same settings (``turnkeep.payloads.composition``)."""
