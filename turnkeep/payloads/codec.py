"""Payload encryption: a Temporal ``PayloadCodec`` that AES-256-GCM encrypts every payload.

With ``encryption`` in turnkeep.yaml, the data converter (``turnkeep.payloads.composition``)
runs every payload through ``EncryptionCodec`` before it leaves the process and after it comes
back, so the server's database, workflow histories and anything that reads them without the
keys see ciphertext: prompts, model replies, tool arguments and tool results. The SDK encodes a
payload *before* external payload storage sees it, so stored large payloads are ciphertext too.

One encrypted payload::

    metadata: encoding = binary/encrypted
              encryption-key-id = <key id>           which key of encryption.keys
              encryption-compression = zlib           only when compressed first
    data:     nonce (12 random bytes) || AES-GCM(serialized original payload) || tag (16 bytes)

The key id and the compression flag are authenticated as associated data, so neither can be
changed without decryption failing. The original payload is serialized whole, so its own
metadata (``encoding: json/plain``, the message type) is encrypted with it.

Decoding refuses payloads that are not ``binary/encrypted`` (``PlaintextPayloadError``): a
client without the keys would otherwise leave its prompt in clear in the history. With
``encryption.allow_plaintext`` (and always in the codec server, which only shows payloads) it
leaves them as they are: payloads written before encryption was turned on, or by a plain client.
External-storage references (plain) never reach it: the SDK replaces each with the stored
payload it points to, which is encrypted, before decoding.

What stays readable by design: workflow ids, activity and workflow type names, timestamps,
search attributes (the server indexes them), and the key ids.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import EncodingPayloadConverter, PayloadCodec

from turnkeep.config.settings import AES_256_KEY_BYTES, EncryptionSettings

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
COMPRESSION = "encryption-compression"
ZLIB = b"zlib"
NONCE_BYTES = 12  # AES-GCM's standard 96-bit nonce, random per payload
TAG_BYTES = 16
# Batches bigger than this are encrypted in a thread: compressing a large tool result would
# stall a worker's event loop (and its heartbeats) meanwhile.
_THREAD_BYTES = 256 * 1024
# zlib's fastest level: a payload is compressed on every hop (each model call re-sends the
# conversation), and on turn payloads (JSON text) it gives up little size to the slower ones.
_ZLIB_LEVEL = 1
# Bound into every ciphertext, with the key id and compression flag.
_AAD_PREFIX = b"turnkeep/payload-codec/1\x00"


class EncryptionError(ValueError):
    """A payload could not be encrypted or decrypted; the message says why and what to do."""


class UnknownKeyError(EncryptionError):
    """A payload names a key id that the configuration does not list."""


class PayloadDecryptionError(EncryptionError):
    """An encrypted payload is malformed or fails authentication (changed, or the wrong key)."""


class PlaintextPayloadError(EncryptionError):
    """An unencrypted payload reached a codec whose config requires encryption."""


class EncryptionNotConfiguredError(EncryptionError):
    """An encrypted payload reached a converter whose config has no ``encryption``."""


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM with a random 96-bit nonce per payload, zlib first when it helps.

    ``keys`` maps key ids to 32-byte keys; new payloads use ``current_key``, and any listed
    key decrypts, so a key can be rotated out once nothing that is kept still uses it.
    """

    def __init__(
        self,
        keys: Mapping[str, bytes],
        current_key: str,
        *,
        compress: bool = True,
        allow_plaintext: bool = False,
    ):
        for key_id, key in keys.items():
            if len(key) != AES_256_KEY_BYTES:
                raise EncryptionError(
                    f"encryption key {key_id!r} is {len(key)} bytes; AES-256 needs "
                    f"{AES_256_KEY_BYTES} (make one with `openssl rand -base64 32`)"
                )
        if current_key not in keys:
            raise EncryptionError(
                f"the current encryption key {current_key!r} is not among the keys ({_ids(keys)})"
            )
        self.current_key = current_key
        self.compress = compress
        self.allow_plaintext = allow_plaintext
        self._ciphers = {key_id: AESGCM(bytes(key)) for key_id, key in keys.items()}
        # Identifies the key set (for `same_codec`) without revealing the keys: SHA-256 of them.
        digest = hashlib.sha256(current_key.encode())
        for key_id in sorted(keys):
            digest.update(b"\x00" + key_id.encode() + b"\x00" + bytes(keys[key_id]))
        self.identity = digest.digest()

    @classmethod
    def from_settings(
        cls, settings: EncryptionSettings, *, allow_plaintext: bool | None = None
    ) -> EncryptionCodec:
        """The codec ``settings`` describe; ``allow_plaintext`` overrides the settings' own."""
        if allow_plaintext is None:
            allow_plaintext = settings.allow_plaintext
        return cls(
            settings.key_bytes(),
            settings.current_key,
            compress=settings.compress,
            allow_plaintext=allow_plaintext,
        )

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._ciphers)

    def same_keys(self, other: EncryptionCodec) -> bool:
        """Whether both have the same keys under the same ids and the same current key."""
        return self.identity == other.identity

    def describe(self) -> str:
        return f"encryption with current key {self.current_key!r} (keys: {_ids(self._ciphers)})"

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if _size(payloads) > _THREAD_BYTES:
            return await asyncio.to_thread(self._encode_all, payloads)
        return self._encode_all(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if _size(payloads) > _THREAD_BYTES:
            return await asyncio.to_thread(self._decode_all, payloads)
        return self._decode_all(payloads)

    def _encode_all(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(payload) for payload in payloads]

    def _decode_all(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(payload) for payload in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        plain = payload.SerializeToString()
        compression = b""
        if self.compress:
            packed = zlib.compress(plain, _ZLIB_LEVEL)
            if len(packed) < len(plain):  # already-compressed or tiny payloads grow
                plain, compression = packed, ZLIB
        key_id = self.current_key.encode()
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[self.current_key].encrypt(nonce, plain, _aad(key_id, compression))
        metadata = {"encoding": ENCODING, KEY_ID: key_id}
        if compression:
            metadata[COMPRESSION] = compression
        return Payload(metadata=metadata, data=nonce + sealed)

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            if self.allow_plaintext:
                return payload
            raise PlaintextPayloadError(
                "a payload is not encrypted, but this turnkeep config requires encrypted "
                "payloads: configure the client that sent it with the same `encryption` settings "
                "as the workers (or set encryption.allow_plaintext: true to accept plaintext)"
            )
        raw_id = payload.metadata.get(KEY_ID)
        if not raw_id:
            raise PayloadDecryptionError(
                f"an encrypted payload has no {KEY_ID} in its metadata, so its key is unknown"
            )
        key_id = raw_id.decode("utf-8", errors="replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownKeyError(
                f"payload was encrypted with key {key_id!r}, which this turnkeep config does "
                f"not list in encryption.keys (it lists {_ids(self._ciphers)}): add key "
                f"{key_id!r} back to read it"
            )
        compression = payload.metadata.get(COMPRESSION, b"")
        if compression not in (b"", ZLIB):
            raise PayloadDecryptionError(
                f"an encrypted payload says it is compressed with {compression!r}, "
                "which turnkeep does not use"
            )
        data = payload.data
        if len(data) < NONCE_BYTES + TAG_BYTES:
            raise PayloadDecryptionError(
                f"an encrypted payload (key {key_id!r}) is {len(data)} bytes, too short to hold "
                "a nonce and an authentication tag"
            )
        try:
            plain = cipher.decrypt(
                data[:NONCE_BYTES], data[NONCE_BYTES:], _aad(raw_id, compression)
            )
        except InvalidTag:
            raise PayloadDecryptionError(
                f"a payload encrypted with key {key_id!r} failed authentication: it was changed "
                f"after it was encrypted, or key {key_id!r} in this config is not the key it "
                "was encrypted with"
            ) from None
        if compression:
            plain = zlib.decompress(plain)  # authenticated above, so it is what we compressed
        original = Payload()
        original.ParseFromString(plain)
        return original


class EncryptedPayloadRefusal(EncodingPayloadConverter):
    """The payload converter for ``binary/encrypted`` when encryption is off: it never writes
    one, and refuses to read one with a message that says what is missing (without it, the
    SDK's error is "Unknown payload encoding binary/encrypted").

    A converter rather than a pass-through codec: the SDK skips its codec pass over every
    activation, completion and activity task when there is no codec, and only a payload that
    is actually encrypted reaches this."""

    @property
    def encoding(self) -> str:
        return ENCODING.decode()

    def to_payload(self, value: Any) -> Payload | None:
        return None

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        refuse_encrypted(payload)


def refuse_encrypted(payload: Payload) -> NoReturn:
    """Raise ``EncryptionNotConfiguredError`` for an encrypted payload met without a codec."""
    key_id = payload.metadata.get(KEY_ID, b"?").decode("utf-8", errors="replace")
    raise EncryptionNotConfiguredError(
        f"payload was encrypted with key {key_id!r}, but this turnkeep config has no "
        "`encryption` section: add the one the workers use (with that key) to read it"
    )


def payload_codec(encryption: EncryptionSettings | None) -> EncryptionCodec | None:
    """The codec the ``encryption`` section describes; ``None`` when encryption is off."""
    if encryption is None:
        return None
    return EncryptionCodec.from_settings(encryption)


def same_codec(a: PayloadCodec | None, b: PayloadCodec | None) -> bool:
    """Whether what one encodes the other decodes, and both write what the other would: the
    same object, or encryption codecs with the same keys and current key."""
    if a is b:
        return True
    if isinstance(a, EncryptionCodec) and isinstance(b, EncryptionCodec):
        return a.same_keys(b)
    return False


def describe_codec(codec: PayloadCodec | None) -> str:
    if codec is None:
        return "no payload encryption"
    if isinstance(codec, EncryptionCodec):
        return codec.describe()
    return f"the payload codec {type(codec).__name__}"


def _aad(key_id: bytes, compression: bytes) -> bytes:
    return _AAD_PREFIX + key_id + b"\x00" + compression


def _ids(keys: Mapping[str, object]) -> str:
    return ", ".join(repr(key_id) for key_id in sorted(keys))


def _size(payloads: Sequence[Payload]) -> int:
    return sum(len(p.data) for p in payloads)
