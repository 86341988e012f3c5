"""Who a request is: a bearer API key, looked up in constant time, and what that key may do
(its agents, whether it may decide). Keys come from the gateway's settings (``${VAR}`` from
the environment, the secrets file) or a keys file; never from a request's body or query, and
no key is ever logged or echoed: a key is named by its name."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from turnkeep.config.settings import GatewayKeySettings, Settings
from turnkeep.contract.turn_io import TaskPriority, TenantName, lowest_priority

ALL_AGENTS = "*"


class KeysFileError(ValueError):
    """The keys file cannot be read as keys (its content is not quoted: it holds secrets)."""


@dataclass(frozen=True)
class ApiKey:
    """A key as the gateway holds it: its name and scope, and the key's digest only."""

    name: str
    digest: bytes
    agents: frozenset[str]  # may hold ALL_AGENTS
    decide: bool
    # What the turns and sessions it starts get, whatever a request says: the priority it
    # lowers them to (None: no say) and their tenant (None: none, for loopback only).
    priority: TaskPriority | None = None
    tenant: str | None = None

    def may_use(self, agent: str) -> bool:
        return ALL_AGENTS in self.agents or agent in self.agents

    def priority_of(self, asked: TaskPriority | None) -> TaskPriority | None:
        """The priority of a turn a request ``asked`` for (None: no say): the lower of the
        two, so a request can lower its key's priority, never raise it."""
        if asked is None and self.priority is None:
            return None
        return lowest_priority(asked, self.priority)

    @classmethod
    def from_settings(cls, name: str, key: GatewayKeySettings) -> ApiKey:
        """Key ``name`` as configured; its tenant defaults to its name."""
        return cls(
            name=name,
            digest=_digest(key.key.get_secret_value()),
            agents=frozenset(key.agents),
            decide=key.decide,
            priority=key.priority,
            tenant=key.tenant if key.tenant is not None else _tenant_name(name),
        )


_TENANT = TypeAdapter(TenantName)


def _tenant_name(name: str) -> str:
    try:
        return _TENANT.validate_python(name)
    except ValidationError:
        raise KeysFileError(
            f"gateway key {name!r} has no `tenant`, and its name cannot be one (a tenant is "
            "at most 64 letters, digits and `._:@-`): give it a `tenant`"
        ) from None


# The identity a gateway without authentication (loopback only) gives every request.
LOOPBACK = ApiKey(name="loopback", digest=b"", agents=frozenset({ALL_AGENTS}), decide=True)


def _digest(key: str) -> bytes:
    # Comparing fixed-size digests: the comparison's time says nothing of a key's length.
    return hashlib.sha256(key.encode("utf-8")).digest()


class KeyRing:
    """The keys a gateway accepts."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self.keys = tuple(keys)
        names = [key.name for key in self.keys]
        if len(set(names)) != len(names):
            raise ValueError("two gateway keys have the same name")

    def identify(self, token: str) -> ApiKey | None:
        """The key ``token`` is, if any. Every key is compared, each in constant time, so the
        time taken says neither which key matched nor how much of one did."""
        digest = _digest(token)
        found: ApiKey | None = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest) and found is None:
                found = key
        return found

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        """The keys of ``gateway.keys`` and of ``gateway.keys_file``."""
        configured: dict[str, GatewayKeySettings] = dict(settings.gateway.keys)
        if settings.gateway.keys_file is not None:
            for name, key in read_keys_file(settings.path(settings.gateway.keys_file)).items():
                if name in configured:
                    raise KeysFileError(f"gateway key {name!r} is both in the config and the file")
                configured[name] = key
        return cls(ApiKey.from_settings(name, key) for name, key in configured.items())


_KEYS = TypeAdapter(dict[str, GatewayKeySettings])


def read_keys_file(path: Path) -> Mapping[str, GatewayKeySettings]:
    """A YAML (or JSON) mapping of key name to ``{key, agents, decide}``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise KeysFileError(f"gateway keys file {path} cannot be read: {err.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        return _KEYS.validate_python(data or {})
    except (ValueError, yaml.YAMLError) as err:
        where = ""
        if isinstance(err, ValidationError) and err.errors():
            first = err.errors()[0]
            where = f" at {'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        raise KeysFileError(f"gateway keys file {path} is not a mapping of keys{where}") from None
