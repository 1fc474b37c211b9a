"""Every internal deadline of a gossip core in one heap, so the shell needs one timer.

Ties run in the order they were set (a sequence number breaks them): a seeded run
replays exactly.
"""

from __future__ import annotations

import heapq
from typing import Any


class Deadlines:
    """A min-heap of (at, seq, kind, arg); `kind` names the handler the owner runs."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0

    def at(self, at: float, kind: str, arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, arg))

    def earliest(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> tuple[float, str, Any] | None:
        """The earliest deadline at or before `now`, removed; one at a time, because a
        handler may set a new deadline that is already due."""
        h = self._heap
        if not h or h[0][0] > now:
            return None
        at, _, kind, arg = heapq.heappop(h)
        return at, kind, arg
