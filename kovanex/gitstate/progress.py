"""A deadline that grows with progress, for transfers between nodes (ADR 0068).

Why not a fixed wall limit: a replica's fetch had 15 s in all, so a repo holding an object
that takes longer than that to move failed at the same point on every try, forever, and
the replica's lag grew without end (issue 24). Here a transfer fails when no byte moved
for `idle_s` (a dead or stalled peer is still noticed that fast) or when it ran `cap_s` in
all (nothing runs unbounded); while bytes keep arriving, it goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Stalled(TimeoutError):
    """The transfer made no progress for its idle limit, or ran past its cap."""


class Progress:
    """When a transfer last moved, and how much it moved; `mark` on every chunk."""

    def __init__(
        self, idle_s: float, cap_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if idle_s <= 0 or cap_s <= 0:
            raise ValueError(f"idle_s ({idle_s}) and cap_s ({cap_s}) must be positive")
        self.idle_s = idle_s
        self.cap_s = cap_s
        self.clock = clock
        self.started = self.last = clock()
        self.moved = 0

    def mark(self, n: int = 1) -> None:
        self.last = self.clock()
        self.moved += n

    def remaining(self) -> float:
        """Seconds until the deadline as of now (it moves on with every `mark`)."""
        return min(self.last + self.idle_s, self.started + self.cap_s) - self.clock()

    def why(self) -> str:
        if self.clock() - self.started >= self.cap_s:
            return f"still running after {self.cap_s:g}s ({self.moved} bytes moved)"
        return f"no progress for {self.idle_s:g}s ({self.moved} bytes moved)"


async def guard(work: Awaitable[T], progress: Progress) -> T:
    """Await `work` while `progress` keeps its deadline ahead; past it, cancel the work
    (its own cleanup kills what it started) and raise `Stalled`."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            left = progress.remaining()
            if task.done():
                return task.result()
            if left <= 0:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise Stalled(progress.why())
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise


__all__ = ["Progress", "Stalled", "guard"]
