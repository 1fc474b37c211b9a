"""The one clock protocol: everything that reads time takes a `Clock`, so tests and the
simulator can run it in virtual time (TigerBeetle's and trio's lesson: time is an input)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch: for records that humans and other nodes read."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: for deadlines, timeouts and ages."""
        ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM = SystemClock()
