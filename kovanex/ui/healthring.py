"""Other nodes' health history for the Health view: the gossiped samples, kept here.

Each node gossips its newest health vector about once a second (topic "health"); only
the latest value stays in gossip. The dashboard keeps the ones it saw in a bounded ring
per member (ADR 0038): the heatmap needs no request to another node, costs nothing when
nobody looks, and still shows how a node that died got there.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from kovanex.clock import Clock

WIDTH = 60  # samples per member: about a minute at gossip's one-per-second cadence


class HealthRing:
    def __init__(self, clock: Clock, width: int = WIDTH) -> None:
        self.clock = clock
        self.width = width
        self.rings: dict[str, deque[tuple[float, dict[str, float]]]] = {}
        self._seen: dict[str, int] = {}  # member -> newest gossip version kept

    def on_item(self, topic: str, payload: Any) -> None:
        """The gossip subscriber: one sample per new version of a member's key; a
        tombstone (the member left or was removed) drops its ring."""
        name = str(getattr(payload, "key", ""))
        value = getattr(payload, "value", None)
        version = int(getattr(payload, "version", 0) or 0)
        if not name:
            return
        if value is None:
            self.rings.pop(name, None)
            self._seen.pop(name, None)
            return
        if not isinstance(value, dict) or version <= self._seen.get(name, -1):
            return
        self._seen[name] = version
        vec = {
            str(k): float(v)
            for k, v in (value.get("vector") or {}).items()
            if isinstance(v, int | float)
        }
        ring = self.rings.setdefault(name, deque(maxlen=self.width))
        ring.append((self.clock.time(), vec))

    def matrix(self, name: str) -> dict[str, list[float | None]]:
        """Rows by metric, oldest -> newest; a metric missing from a sample is None."""
        samples = list(self.rings.get(name, ()))
        metrics = sorted({m for _, vec in samples for m in vec})
        return {m: [vec.get(m) for _, vec in samples] for m in metrics}

    def __len__(self) -> int:
        return len(self.rings)
