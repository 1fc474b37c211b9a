"""A seeded lossy network: loss, duplication, delay, partitions, stalled nodes."""

from __future__ import annotations

import random


class SimNetwork:
    """Decides the fate of each packet; all randomness comes from one seed."""

    def __init__(
        self,
        seed: int,
        loss: float = 0.0,
        duplicate: float = 0.0,
        delay: tuple[float, float] = (0.001, 0.005),
    ) -> None:
        self.rng = random.Random(seed ^ 0x5EED)
        self.loss = loss
        self.duplicate = duplicate
        self.delay = delay
        self._group: dict[str, int] = {}
        self.dropped = 0
        self.delivered = 0

    def partition(self, *groups: set[str] | list[str]) -> None:
        """Split the cluster: packets only flow inside a group (unlisted nodes: group 0)."""
        self._group = {name: i + 1 for i, g in enumerate(groups) for name in g}

    def heal(self) -> None:
        self._group = {}

    def reachable(self, a: str, b: str) -> bool:
        return self._group.get(a, 0) == self._group.get(b, 0)

    def fate(self, src: str, dst: str, reliable: bool = False) -> list[float]:
        """Delays of the copies that arrive (empty = lost)."""
        if not self.reachable(src, dst):
            self.dropped += 1
            return []
        r = self.rng
        if not reliable and self.loss and r.random() < self.loss:
            self.dropped += 1
            return []
        lo, hi = self.delay
        out = [r.uniform(lo, hi)]
        if not reliable and self.duplicate and r.random() < self.duplicate:
            out.append(r.uniform(lo, hi))
        self.delivered += len(out)
        return out
