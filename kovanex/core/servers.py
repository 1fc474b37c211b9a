"""Which SERVER member decides placement for a repo (ADR 0014).

Rendezvous (highest-random-weight) hashing of the repo name over the alive servers:
every node that sees the same members picks the same server without a vote, and when
a server joins or leaves only the repos it wins or held move.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(repo: str, server: str) -> int:
    """A stable 64-bit weight for the pair (blake2b: identical on every node and run)."""
    h = hashlib.blake2b(f"{repo}\0{server}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def placing_server(repo: str, servers: Iterable[str]) -> str | None:
    """The server that places `repo`'s tasks, or None when no server is alive."""
    names = sorted(set(servers))
    if not names:
        return None
    return max(names, key=lambda s: (weight(repo, s), s))


def lone_nats_server(others: int, joins: int, was_clustered: bool) -> bool:
    """A NATS server runs JetStream alone (no cluster block) only when nothing says a
    cluster exists: no other server in gossip, no `join` address in its config, and no
    clustered bucket of its own (ADR 0080). Clustered JetStream waits for a second peer
    before it elects; a node that was ever clustered must wait for its quorum instead of
    leading a KV of its own (that would be a second leader)."""
    return others == 0 and joins == 0 and not was_clustered
