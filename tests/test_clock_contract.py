"""One contract for both clocks: what a service may assume of the time it is given."""

from __future__ import annotations

import pytest

from kovanex.clock import SYSTEM, Clock
from kovanex.testing import FakeClock


@pytest.fixture(params=["system", "fake"])
def clock(request: pytest.FixtureRequest) -> Clock:
    return SYSTEM if request.param == "system" else FakeClock()


def test_monotonic_never_goes_back(clock: Clock) -> None:
    seen = [clock.monotonic() for _ in range(1000)]
    assert seen == sorted(seen)


def test_wall_time_is_seconds_since_the_epoch(clock: Clock) -> None:
    assert 1.6e9 < clock.time() < 4.1e9  # 2020..2099


def test_a_fake_clock_moves_only_when_told_and_never_back() -> None:
    c = FakeClock()
    t, m = c.time(), c.monotonic()
    assert (c.time(), c.monotonic()) == (t, m)
    c.advance(2.5)
    assert (c.time() - t, c.monotonic() - m) == (2.5, 2.5)
    with pytest.raises(ValueError):
        c.advance(-1)
