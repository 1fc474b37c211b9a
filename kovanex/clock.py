"""The one clock protocol: everything that reads time, sleeps or sets a timer takes a `Clock`,
so tests and the simulator can run it in virtual time (TigerBeetle's and trio's lesson: time
is an input). `kovanex.testing` ships a fake clock and an event loop that jumps idle time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Timer(Protocol):
    """A pending `call_later`: cancel it to keep its callback from running."""

    def cancel(self) -> None: ...

    def cancelled(self) -> bool: ...


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch: for records that humans and other nodes read."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: for deadlines, timeouts and ages."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after `seconds` on this clock (0 or less: just yield to the loop)."""
        ...

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        """Run `callback(*args)` on the event loop once `delay` seconds have passed."""
        ...

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        """`aw`'s result, or TimeoutError (and `aw` cancelled) once `timeout` has passed."""
        ...


class AsyncioTimers:
    """Sleeps and timers on the running event loop's own clock. Why share them: on the real
    loop that clock is `time.monotonic`, and on `kovanex.testing.VirtualTimeLoop` it is the
    fake clock, so one implementation serves both."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback, *args)

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        return await asyncio.wait_for(aw, timeout)


class SystemClock(AsyncioTimers):
    """The real clock: the loop's timers run on `time.monotonic`, as asyncio's do."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM = SystemClock()


async def settled(clock: Clock, tasks: Iterable[asyncio.Future[Any]], timeout: float) -> None:
    """`asyncio.wait(tasks, timeout=...)` on `clock`: wait (bounded) for the tasks to end,
    never raising their errors and never cancelling them."""
    pending = set(tasks)
    if pending:
        with contextlib.suppress(TimeoutError):
            await clock.wait_for(asyncio.wait(pending), timeout)
