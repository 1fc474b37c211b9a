"""A heap of timed callbacks with a virtual clock that jumps to the next event."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class SimLoop:
    """Virtual-time event loop; ties break by insertion order, so runs are deterministic."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.events = 0

    def call_at(self, at: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(at, self.now), self._seq, fn, args))

    def run_until(
        self, t: float, stop: Callable[[], bool] | None = None, every: float = 0.05
    ) -> bool:
        """Run events up to time t, or until `stop()` is true (checked every `every` s)."""
        h = self._heap
        check = self.now
        while h and h[0][0] <= t:
            at, _, fn, args = heapq.heappop(h)
            self.now = at
            self.events += 1
            fn(*args)
            if stop is not None and at >= check:
                if stop():
                    return True
                check = at + every
        self.now = max(self.now, t)
        return stop is not None and stop()
