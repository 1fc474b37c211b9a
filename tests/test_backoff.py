"""Backoff delay tables (pure: clock readings are passed in)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kovanex.core.backoff import Backoff


@pytest.mark.parametrize(
    ("params", "runs", "expected"),
    [
        # (now, last_start) pairs: each run lasted now - last_start seconds
        ({}, [(1, 0)] * 7, [1, 2, 4, 8, 16, 30, 30]),
        ({"base": 0.5, "factor": 3, "max": 10}, [(0, 0)] * 5, [0.5, 1.5, 4.5, 10, 10]),
        # a stable run (>= reset_after) forgives the history
        ({}, [(1, 0), (1, 0), (1, 0), (160, 100), (1, 0)], [1, 2, 4, 1, 2]),
        # just under reset_after is not stable
        ({}, [(1, 0), (1, 0), (59.9, 0)], [1, 2, 4]),
        ({"reset_after": 5}, [(1, 0), (1, 0), (5, 0)], [1, 2, 1]),
        ({"factor": 1, "base": 3}, [(0, 0)] * 3, [3, 3, 3]),
    ],
)
def test_delay_table(params: dict, runs: list[tuple[float, float]], expected: list[float]) -> None:
    b = Backoff(**params)
    assert [b.next_delay(now, start) for now, start in runs] == pytest.approx(expected)


def test_reset() -> None:
    b = Backoff(base=1)
    b.next_delay(0, 0)
    b.next_delay(0, 0)
    b.reset()
    assert b.next_delay(0, 0) == 1


@pytest.mark.parametrize(
    "params", [{"base": -1}, {"factor": 0.5}, {"base": 10, "max": 5}, {"reset_after": 0}]
)
def test_rejects_nonsense(params: dict) -> None:
    with pytest.raises(ValueError):
        Backoff(**params)


@given(st.lists(st.floats(min_value=0, max_value=1e6), max_size=300))
def test_delays_are_bounded_and_never_overflow(durations: list[float]) -> None:
    b = Backoff(base=0.05, factor=2, max=30, reset_after=60)
    prev = 0.0
    for d in durations:
        delay = b.next_delay(1000.0 + d, 1000.0)
        assert 0.05 <= delay <= 30
        if d < 60:
            assert delay >= prev  # grows (or stays capped) until a stable run
        prev = delay
