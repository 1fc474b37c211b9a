"""Give the heap that tasks freed back to the system once the node is idle.

A task's run touches the repo through libgit2 in worker threads (a packed-refs parse of
10,000 archived refs is ~1.2 MB), and glibc keeps what they freed in each thread's arena:
eight pushes on a repo with 10,000 archived tasks left the agent ~13 MB above where it
started, against ~3 MB on an empty repo (issue 22 part 7). `malloc_trim` hands it back.
It runs once the runs have ended and stayed ended for a moment, never per task and never
on a timer of its own: an idle node does no work for it."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from kovanex.clock import SYSTEM, Clock, Timer

SETTLE_S = 2.0  # a burst of tasks trims once, after its last run


def trim_heap() -> bool:
    """Return free pages of every malloc arena to the system; False when not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


class IdleTrim:
    """`idle()` when the last run ends: trims after SETTLE_S if nothing ran meanwhile."""

    def __init__(
        self, busy: Callable[[], bool], settle_s: float = SETTLE_S, clock: Clock = SYSTEM
    ) -> None:
        self.busy = busy
        self.settle_s = settle_s
        self.clock = clock
        self.trims = 0  # kovanex status / tests
        self._timer: Timer | None = None

    def idle(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.clock.call_later(self.settle_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if not self.busy() and trim_heap():
            self.trims += 1

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
