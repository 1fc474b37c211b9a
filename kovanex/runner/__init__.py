"""The runner: executes steps and services on a node, within limits, into logs and worktrees."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from kovanex.runner.limits import Limits, detect
from kovanex.runner.logs import LOG_CAP_BYTES, capped, follow, read_capped
from kovanex.runner.process import StepOutcome, run_step, step_env
from kovanex.runner.service import ServiceOutcome, supervise


class RunnerSlots:
    """A semaphore whose free/used counts are public, so the agent can advertise capacity.

    Waiters are served first come, first served; a cancelled waiter takes no slot.
    Zero slots is a node that runs nothing (SERVER and STORAGE roles): it never acquires.
    """

    def __init__(self, total: int) -> None:
        if total < 0:
            raise ValueError(f"runner slots must be >= 0, got {total}")
        self.total = total
        self._used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._free_units = list(range(total))  # a slot is a compute unit (units.py)

    @property
    def used(self) -> int:
        return self._used

    @property
    def free(self) -> int:
        return self.total - self._used

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def try_acquire(self) -> bool:
        """Take a slot only if one is free now and nobody is queued ahead of us."""
        if self._used < self.total and not self.waiting:
            self._used += 1
            return True
        return False

    async def acquire(self) -> None:
        if self.try_acquire():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # a slot was handed to us just as we were cancelled
            raise
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)

    def release(self) -> None:
        """Hand the slot straight to the oldest waiter, so `used` never dips and gets stolen."""
        if self._used <= 0:
            raise RuntimeError("release() without acquire()")
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._used -= 1

    def take_unit(self) -> int:
        """The lowest free unit index, for a caller that holds a slot."""
        if not self._free_units:
            raise RuntimeError("take_unit() without a free slot")
        self._free_units.sort()
        return self._free_units.pop(0)

    def give_unit(self, index: int) -> None:
        if index not in self._free_units:
            self._free_units.append(index)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    async def __aenter__(self) -> RunnerSlots:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


__all__ = [
    "LOG_CAP_BYTES",
    "Limits",
    "RunnerSlots",
    "ServiceOutcome",
    "StepOutcome",
    "capped",
    "detect",
    "follow",
    "read_capped",
    "run_step",
    "step_env",
    "supervise",
]
