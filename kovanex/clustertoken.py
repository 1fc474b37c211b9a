"""The cluster token: the secret every node shares and the gossip key it carries.

`secrets/cluster.token` holds the join value `kovanex init` printed. Its secret guards
git-over-HTTP and the API between nodes; its key encrypts gossip. Only this module
splits the two, so the key never travels where the secret goes (HTTP auth).
"""

from __future__ import annotations

import base64
import binascii
import os

from kovanex.datadir import ConfigError, Layout


def write_token(layout: Layout, token: str) -> None:
    """The cluster token guards git-over-HTTP and the API; every node shares it (0600)."""
    layout.token_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = layout.token_file.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token.strip() + "\n")
    os.replace(tmp, layout.token_file)


# The join value is `<secret>.<gossip key>`: one string carries both, so a joiner needs
# one thing from the first node. The key is 32 bytes, urlsafe base64 without padding.
GOSSIP_KEY_LEN = 32
_KEY_B64_LEN = 43
_HKDF_INFO = b"kovanex gossip key v1"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def make_join_value(secret: str, key: bytes) -> str:
    """The whole `--token` value: the cluster secret and the gossip key together."""
    if len(key) != GOSSIP_KEY_LEN:
        raise ValueError(f"gossip key must be {GOSSIP_KEY_LEN} bytes, got {len(key)}")
    return f"{secret}.{_b64url(key)}"


def split_join_value(value: str) -> tuple[str, bytes]:
    """(secret, gossip key). A legacy bare value (no valid key suffix) derives its key
    with HKDF-SHA256, so every node given the same value still shares one key."""
    value = value.strip()
    if not value:
        raise ConfigError("the cluster token is empty; pass the value `kovanex init` printed")
    secret, sep, tail = value.rpartition(".")
    if sep and secret and len(tail) == _KEY_B64_LEN:
        try:
            raw = base64.urlsafe_b64decode(tail + "=")
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) == GOSSIP_KEY_LEN and _b64url(raw) == tail:
            return secret, raw
    return value, derive_gossip_key(value)


def derive_gossip_key(secret: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    hkdf = HKDF(algorithm=hashes.SHA256(), length=GOSSIP_KEY_LEN, salt=None, info=_HKDF_INFO)
    return hkdf.derive(secret.encode())


def new_join_value() -> str:
    """A fresh cluster: 16 random bytes of secret (hex) and a random 32-byte gossip key."""
    import secrets

    return make_join_value(secrets.token_hex(16), secrets.token_bytes(GOSSIP_KEY_LEN))


def read_join_value(layout: Layout) -> str:
    """The whole value in `secrets/cluster.token`, as `--token` takes it."""
    try:
        return layout.token_file.read_text().strip()
    except FileNotFoundError as e:
        raise ConfigError(
            f"no cluster token at {layout.token_file}; re-run `kovanex init --force --token T`"
        ) from e


def read_token(layout: Layout) -> str:
    """Only the cluster secret (HTTP auth between nodes); never the gossip key."""
    return split_join_value(read_join_value(layout))[0]


def gossip_key(layout: Layout) -> bytes:
    return split_join_value(read_join_value(layout))[1]
