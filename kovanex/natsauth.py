"""NATS credentials, derived from the cluster token with HKDF, and the locked KV stream
(issue 24, ADR 0059, 0060).

Why derived and not generated: every node already holds the cluster token (the secret and
the gossip keyring), so each one computes the same users, the same route password and the
same cluster name with nothing new to distribute or store. A step, a stranger on the
network, or a node with another token holds none of it, so the server refuses them.

- Client users: one per gossip keyring key (the primary first). `kovanex keys` rotation
  carries them along: install adds a user on every server, use makes the agent log in
  with it, remove drops the old user (the server closes its connections on reload).
- Routes: one user and password from the cluster secret (nats-server's cluster
  `authorization` takes exactly one), so a route never breaks mid-rotation.
- The cluster name: a hash of the cluster secret, never the constant `kovanex`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from kovanex import config as cfgmod

BUCKET = "kovanex"
STREAM = f"KV_{BUCKET}"
_INFO_CLIENT = b"kovanex nats client v1"
_INFO_ROUTE = b"kovanex nats route v1"
_INFO_NAME = b"kovanex nats cluster name v1"
_INFO_FALLBACK = b"kovanex nats client key v1"


def _hkdf(material: bytes, info: bytes, length: int = 32) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(material)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@dataclass(frozen=True)
class Login:
    """One user and its password. repr hides the password: these end up in reprs of
    config objects, and a secret must never reach a log."""

    user: str
    password: str

    def __repr__(self) -> str:
        return f"Login(user={self.user!r}, password=<hidden>)"


def client_login(key: bytes) -> Login:
    """The agent's login for one gossip key: 16 bytes name the user, 32 the password."""
    raw = _hkdf(key, _INFO_CLIENT, 48)
    return Login(f"kx-{raw[:8].hex()}", _b64(raw[8:]))


def route_login(secret: str) -> Login:
    raw = _hkdf(secret.encode(), _INFO_ROUTE, 40)
    return Login(f"kx-route-{raw[:8].hex()}", _b64(raw[8:]))


def cluster_name(secret: str) -> str:
    """Routes between servers of different names are refused; a name nobody can guess
    also keeps a stranger's `cluster { name: "kovanex" }` from matching ours."""
    return f"kovanex-{_hkdf(secret.encode(), _INFO_NAME, 6).hex()}"


def client_keys(layout: cfgmod.Layout, cfg: cfgmod.NodeConfig | None = None) -> list[bytes]:
    """The keys client users derive from, primary first: the gossip keyring (keyring.json
    or the token's key). A node on --insecure-gossip has an empty keyring; its one key
    then derives from the cluster secret, so NATS stays locked even there."""
    from kovanex.agent.cluster import load_keyring

    return login_keys(load_keyring(layout, cfg).keys(), cfgmod.read_token(layout))


def login_keys(keyring: list[bytes], secret: str) -> list[bytes]:
    """The keyring's keys, or (empty keyring) one derived from the cluster secret."""
    return list(keyring) or [_hkdf(secret.encode(), _INFO_FALLBACK)]


def agent_login(layout: cfgmod.Layout, cfg: cfgmod.NodeConfig | None = None) -> Login:
    """What a node's agent (or a bench on its behalf) connects with: the primary's user."""
    return client_login(client_keys(layout, cfg)[0])


@dataclass(frozen=True)
class ServerAuth:
    """Who may talk to a server: the cluster's name, its route login, and the client
    users (one per gossip key, the agent's primary first)."""

    cluster: str
    route: Login
    users: tuple[Login, ...]


def server_auth(secret: str, keyring: list[bytes], name: str = "") -> ServerAuth:
    """Everything a node's nats.conf and its client need, from the token alone.
    `name`: a cluster name set in [coordination] (else derived)."""
    return ServerAuth(
        cluster=name or cluster_name(secret),
        route=route_login(secret),
        users=tuple(client_login(k) for k in login_keys(keyring, secret)),
    )


def agent_permissions() -> dict[str, Any]:
    """The only subjects the agent's user may touch: the bucket's keys, the JetStream API
    calls coordination/backend.py makes on the bucket's stream, and its own reply inboxes. No
    purge, no delete, no other stream, no other account's traffic."""
    api = "$JS.API"
    return {
        "publish": {
            "allow": [
                f"$KV.{BUCKET}.>",
                f"{api}.INFO",
                f"{api}.STREAM.INFO.{STREAM}",
                f"{api}.STREAM.CREATE.{STREAM}",
                f"{api}.STREAM.UPDATE.{STREAM}",
                f"{api}.STREAM.MSG.GET.{STREAM}",
                f"{api}.DIRECT.GET.{STREAM}",
                f"{api}.DIRECT.GET.{STREAM}.>",
                f"{api}.STREAM.LEADER.STEPDOWN.{STREAM}",
            ]
        },
        "subscribe": {"allow": ["_INBOX.>"]},
    }


def kv_stream(replicas: int) -> Any:
    """The bucket's stream as nats-py's create_key_value makes it (history 1), but locked:
    no purge, no rollup header, no delete. The agent only creates, updates and puts
    keys, so it loses nothing; one rollup PURGE once emptied the leader key (issue 24)."""
    from nats.js import api

    return api.StreamConfig(
        name=STREAM,
        subjects=[f"$KV.{BUCKET}.>"],
        allow_rollup_hdrs=False,
        deny_delete=True,
        deny_purge=True,
        allow_msg_ttl=True,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=120.0,
        max_consumers=-1,
        max_msgs=-1,
        max_msgs_per_subject=1,
        num_replicas=replicas,
    )


def locked(config: Any) -> bool:
    return bool(config.deny_purge) and not config.allow_rollup_hdrs
