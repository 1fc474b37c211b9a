"""Builders for fast in-process tests (shipped like trio.testing): a fake clock now;
nodes, clusters and task specs are added beside it as the deciders need them."""

from __future__ import annotations


class FakeClock:
    """A `kovanex.clock.Clock` that only moves when a test says so."""

    def __init__(self, wall: float = 1_700_000_000.0, mono: float = 1000.0) -> None:
        self._wall = wall
        self._mono = mono

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self._wall += seconds
        self._mono += seconds
