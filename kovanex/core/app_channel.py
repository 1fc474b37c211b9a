"""The application key/value channel gossip carries beside membership.

Each (topic, key) holds the last write by (version, origin): a Lamport-style clock per
node makes a local write win over every value it has seen. A None value is a
tombstone: it spreads like a value, then is reaped after a TTL, so keys of finished
work do not pile up forever.
"""

from __future__ import annotations

from typing import Any

from kovanex.core.broadcast import BroadcastQueue
from kovanex.core.gossip_msgs import AppData, encoded_size


class AppChannel:
    """The values this node knows and the queue that spreads the new ones."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], AppData] = {}
        self.queue = BroadcastQueue()
        self._gone: dict[tuple[str, str], float] = {}  # value None: a tombstone, since
        self._clock = 0

    def write(self, topic: str, key: str, value: Any, origin: str, max_size: int) -> AppData:
        """A local write; ValueError when it cannot fit `max_size` bytes on the wire."""
        old = self.values.get((topic, key))
        self._clock = max(self._clock, old.version if old else 0) + 1
        entry = AppData(topic, key, value, origin, self._clock)
        size = encoded_size(entry)
        if size > max_size:
            raise ValueError(f"app value too large for one packet ({size} bytes)")
        self.values[(topic, key)] = entry
        self.queue.queue(entry, size, f"a:{topic}:{key}")
        return entry

    def merge(self, a: AppData) -> bool:
        """Take a remote value if it is newer; True when it was (publish and spread it)."""
        old = self.values.get((a.topic, a.key))
        if old is not None and (a.version, a.origin) <= (old.version, old.origin):
            return False
        self.values[(a.topic, a.key)] = a
        self._clock = max(self._clock, a.version)
        self.queue.queue(a, encoded_size(a), f"a:{a.topic}:{a.key}")
        return True

    def reap(self, now: float, ttl: float) -> None:
        """Drop tombstones that have been None for `ttl` (a value set since restarts it)."""
        app, gone = self.values, self._gone
        for k in [k for k, a in app.items() if a.value is None]:
            if now - gone.setdefault(k, now) >= ttl:
                del app[k], gone[k]
        for k in [k for k in gone if k not in app or app[k].value is not None]:
            del gone[k]  # set again since
