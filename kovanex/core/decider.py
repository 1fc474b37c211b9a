"""One decider shape, one driver (issue 25 part 5, ADR 0091).

Every core that remembers something between events has the shape of core/leader.py:
`decide(state, event, now) -> (state, effects)`. Pure: no I/O, no clock, no randomness;
the state and the events are frozen values. So one driver runs any of them, in a shell
(which gathers events and carries out effects) or in the simulator and the tests (which
feed events at virtual times and look at the effects). The driver only threads the state:
it never interprets an effect, and it keeps no clock of its own (`now` is the caller's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

S = TypeVar("S")
E = TypeVar("E")
F = TypeVar("F")

Decide = Callable[[S, E, float], tuple[S, Sequence[F]]]


class Driver(Generic[S, E, F]):
    """Holds one decider's state; `step` applies one event at `now` and returns its effects.

    Why a class and not a closure: a shell reads the state between events (status pages,
    `summary()`), and a test swaps it to set a scene."""

    def __init__(self, decide: Decide[S, E, F], state: S) -> None:
        self.decide = decide
        self.state = state

    def step(self, event: E, now: float) -> list[F]:
        self.state, effects = self.decide(self.state, event, now)
        return list(effects)


def replay(
    decide: Decide[S, E, F], state: S, events: Iterable[tuple[float, E]]
) -> tuple[S, list[tuple[float, F]]]:
    """Feed `(now, event)` pairs in order; the final state and every effect with its time.
    A recorded run replayed here gives the same effects: the deciders are pure."""
    out: list[tuple[float, F]] = []
    for now, ev in events:
        state, effects = decide(state, ev, now)
        out.extend((now, f) for f in effects)
    return state, out
