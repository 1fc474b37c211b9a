"""AES-GCM keyring for gossip packets (memberlist keyring.go + security.go).

Rotation follows Serf: install a key everywhere (decrypt only), use it
(becomes the primary that encrypts), then remove the old one. The primary can
never be removed. Decryption tries every installed key, primary first.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_SIZE = 12
TAG_SIZE = 16
KEY_SIZES = (16, 24, 32)


def keygen() -> str:
    """A new 32-byte key, base64 (what `kovanex keygen` prints)."""
    return base64.b64encode(secrets.token_bytes(32)).decode()


def decode_key(key: str | bytes) -> bytes:
    """Accept raw bytes or base64 text; validate the AES key size."""
    raw = base64.b64decode(key, validate=True) if isinstance(key, str) else bytes(key)
    if len(raw) not in KEY_SIZES:
        raise ValueError(f"gossip key must be 16, 24 or 32 bytes, got {len(raw)}")
    return raw


class Keyring:
    """Ordered keys, primary first. Mutations take effect on the next packet."""

    def __init__(self, keys: list[str | bytes] | None = None, primary: str | bytes | None = None):
        self._keys: list[bytes] = []
        self._aead: dict[bytes, AESGCM] = {}
        for k in keys or []:
            self.install(k)
        if primary is not None:
            self.install(primary)
            self.use(primary)

    @property
    def primary(self) -> bytes | None:
        return self._keys[0] if self._keys else None

    def keys(self) -> list[bytes]:
        return list(self._keys)

    def list(self) -> list[str]:
        """Installed keys in base64, primary first."""
        return [base64.b64encode(k).decode() for k in self._keys]

    def install(self, key: str | bytes) -> None:
        """Add a key for decryption; the first key ever installed becomes primary."""
        raw = decode_key(key)
        if raw not in self._aead:
            self._aead[raw] = AESGCM(raw)
            self._keys.append(raw)

    def use(self, key: str | bytes) -> None:
        """Make an installed key the primary (the one that encrypts)."""
        raw = decode_key(key)
        if raw not in self._aead:
            raise KeyError("install the key before using it")
        self._keys.remove(raw)
        self._keys.insert(0, raw)

    def remove(self, key: str | bytes) -> None:
        raw = decode_key(key)
        if raw == self.primary:
            raise ValueError("refusing to remove the primary key; use another key first")
        if raw in self._aead:
            self._keys.remove(raw)
            del self._aead[raw]

    def encrypt(self, plaintext: bytes, aad: bytes) -> bytes:
        """nonce || ciphertext || tag with the primary key."""
        if self.primary is None:
            raise ValueError("keyring is empty")
        nonce = secrets.token_bytes(NONCE_SIZE)
        return nonce + self._aead[self.primary].encrypt(nonce, plaintext, aad)

    def decrypt(self, data: bytes, aad: bytes) -> bytes | None:
        """Try every key; None if none authenticates."""
        if len(data) < NONCE_SIZE + TAG_SIZE:
            return None
        nonce, ct = data[:NONCE_SIZE], data[NONCE_SIZE:]
        for k in self._keys:
            try:
                return self._aead[k].decrypt(nonce, ct, aad)
            except InvalidTag:
                continue
        return None

    # ----------------------------------------------------------- persistence
    def save(self, path: str | Path) -> None:
        """Write {"keys": [...], "primary": ...} with mode 0600, atomically."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        data = json.dumps({"keys": self.list(), "primary": self.list()[0] if self._keys else None})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> Keyring:
        data = json.loads(Path(path).read_text())
        return cls(data.get("keys", []), data.get("primary"))

    def sync_to(self, other: Keyring) -> None:
        """Make this keyring hold exactly `other`'s keys and primary (live reload)."""
        for k in other.keys():
            self.install(k)
        if other.primary is not None:
            self.use(other.primary)
        for k in self.keys():
            if k not in other._aead:
                self.remove(k)
