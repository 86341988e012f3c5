"""``Compact``: a model whose payloads leave out the fields that hold their defaults.

Every activity's request and result is recorded in its turn's history, for every turn. A
field at its default says nothing that reading the payload back would not restore, so a
payload leaves it out; a dump for anything else (a client's JSON, the CLI's ``--json``) keeps
every field. turnkeep's payload converter dumps with a context, which is how the two are told
apart.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SerializationInfo, SerializerFunctionWrapHandler, model_serializer


class Compact(BaseModel):
    @model_serializer(mode="wrap")
    def _leave_out_defaults(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> Any:
        data = handler(self)
        if not isinstance(data, dict) or not isinstance(info.context, dict):
            return data
        for name, default in _defaults(type(self)).items():
            if name in data and getattr(self, name) == default:
                del data[name]
        return data


# Each class's optional fields and their defaults, worked out once: asking pydantic for a
# default that comes from a factory inspects the factory's signature every time, on every
# payload of the turn's path.
_DEFAULTS: dict[type[BaseModel], dict[str, Any]] = {}


def _defaults(cls: type[BaseModel]) -> dict[str, Any]:
    found = _DEFAULTS.get(cls)
    if found is None:
        found = {
            name: field.get_default(call_default_factory=True)
            for name, field in cls.model_fields.items()
            if not field.is_required()
        }
        _DEFAULTS[cls] = found
    return found
