"""Restart delays for supervised services: exponential, capped, forgiven after stable runs.

Pure (the caller passes clock readings), so the supervisor and the simulator share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """Delay before restart n is base * factor**n, capped at `max`.

    A run that lasted at least `reset_after` seconds counts as stable: the crash
    that ended it starts a fresh series, so a service that crashes once a day
    never accumulates a 30 s restart delay.
    """

    base: float = 1.0
    factor: float = 2.0
    max: float = 30.0
    reset_after: float = 60.0
    attempt: int = field(default=0)

    def __post_init__(self) -> None:
        if self.base < 0 or self.factor < 1 or self.max < self.base or self.reset_after <= 0:
            raise ValueError(f"invalid backoff parameters: {self!r}")

    def next_delay(self, now: float, last_start: float) -> float:
        """Delay before restarting a run that started at `last_start` and ended at `now`."""
        if now - last_start >= self.reset_after:
            self.attempt = 0
        delay = min(self.max, self.base * self.factor**self.attempt)
        if delay < self.max:  # stop counting once capped: no float overflow
            self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0
