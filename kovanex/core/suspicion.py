"""Lifeguard dynamic suspicion timeout (memberlist suspicion.go).

A suspicion starts with a long timeout and shrinks as independent members
confirm it, so a truly failed node is declared dead quickly while a node only
one slow peer suspects has time to refute.
"""

from __future__ import annotations

import math


def suspicion_timeout(mult: int, n: int, interval: float) -> float:
    """mult × max(1, log10 n) × probe interval (the minimum suspicion timeout)."""
    node_scale = max(1.0, math.log10(max(1, n)))
    return mult * node_scale * interval


def remaining_timeout(confirmations: int, k: int, elapsed: float, lo: float, hi: float) -> float:
    """Time left: max − ln(c+1)/ln(k+1) × (max − min), floored at min, minus elapsed."""
    frac = math.log(confirmations + 1.0) / math.log(k + 1.0) if k > 0 else 1.0
    timeout = max(lo, hi - frac * (hi - lo))
    return timeout - elapsed


class Suspicion:
    """One suspicion of one member: who confirmed it and when it fires."""

    __slots__ = ("start", "lo", "hi", "k", "confirmers", "incarnation")

    def __init__(
        self, start: float, lo: float, hi: float, k: int, suspector: str, incarnation: int
    ) -> None:
        self.start = start
        self.lo = lo
        self.hi = hi if k > 0 else lo
        self.k = k
        self.confirmers: set[str] = {suspector}
        self.incarnation = incarnation

    @property
    def confirmations(self) -> int:
        """Independent confirmations beyond the first suspector."""
        return len(self.confirmers) - 1

    def confirm(self, frm: str) -> bool:
        """Record a confirmation; True if it was new and counted (up to k)."""
        if self.confirmations >= self.k or frm in self.confirmers:
            return False
        self.confirmers.add(frm)
        return True

    def deadline(self) -> float:
        """Absolute time at which the member is declared dead."""
        return self.start + remaining_timeout(self.confirmations, self.k, 0.0, self.lo, self.hi)
