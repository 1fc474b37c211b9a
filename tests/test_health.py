"""Health matrix and score: calibration against the seed, bounds, monotonicity, recency."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kovanex.core.health import (
    DEFAULT_WEIGHTS,
    IDX,
    METRICS,
    HealthMatrix,
    decay_kernel,
    health_score,
    metric_goodness,
)

SEED_EXAMPLE = {
    "cpu_pct": [45.2, 48.1, 52.3, 49.7, 47.0],
    "mem_pct": [62.0, 62.5, 63.1, 62.8, 62.3],
    "db_lat_ms": [2.1, 2.3, 2.5, 2.2, 2.0],
    "queue_depth": [3, 5, 8, 4, 2],
    "runner_free": [2, 1, 0, 1, 2],
}

PROFILE = settings(max_examples=60, deadline=None)


def test_seed_example_scores_074() -> None:
    assert health_score(SEED_EXAMPLE) == pytest.approx(0.74, abs=0.02)
    # The runner total the seed leaves implicit (2: the max free seen) gives the same answer.
    assert health_score(SEED_EXAMPLE, runner_total=2) == pytest.approx(0.74, abs=0.02)


def test_missing_disk_row_drops_out_rather_than_counting_as_bad_or_good() -> None:
    g = metric_goodness(SEED_EXAMPLE)
    assert math.isnan(g[IDX["disk_pct"]])
    with_bad_disk = dict(SEED_EXAMPLE, disk_pct=[99.0] * 5)
    with_good_disk = dict(SEED_EXAMPLE, disk_pct=[1.0] * 5)
    base = health_score(SEED_EXAMPLE)
    assert health_score(with_bad_disk) < base < health_score(with_good_disk)


def test_matrix_form_matches_named_rows() -> None:
    mat = np.full((len(METRICS), 5), np.nan)
    for name, row in SEED_EXAMPLE.items():
        mat[IDX[name]] = row
    assert health_score(mat) == health_score(SEED_EXAMPLE)


def test_weights_matter_and_default_weights_sum_to_one() -> None:
    assert sum(DEFAULT_WEIGHTS.values()) == pytest.approx(1.0)
    only_cpu = {m: (1.0 if m == "cpu_pct" else 0.0) for m in METRICS}
    # Only cpu weighted: score is the kernel-smoothed cpu goodness alone.
    assert health_score(SEED_EXAMPLE, weights=only_cpu) == pytest.approx(
        metric_goodness(SEED_EXAMPLE)[IDX["cpu_pct"]]
    )


def test_no_data_scores_zero_and_critical_metric_drags_score_down() -> None:
    assert health_score(np.full((6, 5), np.nan)) == 0.0
    assert health_score(np.zeros((6, 0))) == 0.0
    full_disk = dict(SEED_EXAMPLE, disk_pct=[100.0] * 5)
    assert health_score(full_disk) == 0.0  # geometric mean: a full disk is not "85% healthy"
    full_mem = dict(SEED_EXAMPLE, mem_pct=[100.0] * 5)
    assert health_score(full_mem) == 0.0
    # A pegged CPU (or every runner busy) is busy, not broken: low but not zero.
    pegged = dict(SEED_EXAMPLE, cpu_pct=[100.0] * 5, runner_free=[0] * 5)
    assert 0.0 < health_score(pegged) < 0.5 * health_score(SEED_EXAMPLE)


def test_kernel_is_normalised_and_recent_heavy() -> None:
    k = decay_kernel(5)
    assert k.sum() == pytest.approx(1.0)
    assert np.all(np.diff(k) > 0)
    # A custom kernel that only sees the newest column ignores older spikes entirely.
    spiky = dict(SEED_EXAMPLE, cpu_pct=[100.0, 100.0, 100.0, 100.0, 47.0])
    assert health_score(spiky, kernel=[1.0]) == health_score(
        {k2: v[-1:] for k2, v in spiky.items()}
    )


finite = st.floats(min_value=-50, max_value=1e4, allow_nan=False, allow_infinity=False)
anyfloat = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([np.nan, np.inf, -np.inf, -1.0])
)


@PROFILE
@given(
    cells=st.lists(anyfloat, min_size=6 * 5, max_size=6 * 5),
    runner_total=st.one_of(st.none(), st.integers(-1, 8)),
)
def test_score_always_in_unit_interval(cells: list[float], runner_total: int | None) -> None:
    mat = np.array(cells).reshape(6, 5)
    s = health_score(mat, runner_total=runner_total)
    assert 0.0 <= s <= 1.0 and not math.isnan(s)


def _matrix(rows: list[list[float]]) -> np.ndarray:
    return np.array(rows, dtype=float)


cell = st.floats(min_value=0, max_value=150, allow_nan=False)
rows_st = st.lists(st.lists(cell, min_size=5, max_size=5), min_size=6, max_size=6)


@PROFILE
@given(
    rows=rows_st,
    metric=st.sampled_from(METRICS),
    col=st.integers(0, 4),
    delta=st.floats(min_value=0.01, max_value=500),
)
def test_monotone_in_each_metric(
    rows: list[list[float]], metric: str, col: int, delta: float
) -> None:
    base = _matrix(rows)
    worse = base.copy()
    worse[IDX[metric], col] += delta
    s0 = health_score(base, runner_total=8)
    s1 = health_score(worse, runner_total=8)
    if metric == "runner_free":
        assert s1 >= s0 - 1e-12
    else:
        assert s1 <= s0 + 1e-12


@PROFILE
@given(
    levels=st.lists(st.floats(min_value=0, max_value=60), min_size=6, max_size=6),
    metric=st.sampled_from(["cpu_pct", "mem_pct", "disk_pct", "db_lat_ms", "queue_depth"]),
)
def test_newest_spike_moves_score_more_than_oldest(levels: list[float], metric: str) -> None:
    base = np.repeat(np.array(levels, dtype=float)[:, None], 5, axis=1)
    base[IDX["runner_free"]] = 2.0
    spike = 100.0 if metric.endswith("_pct") else 500.0
    newest, oldest = base.copy(), base.copy()
    newest[IDX[metric], -1] = spike
    oldest[IDX[metric], 0] = spike
    s_base = health_score(base)
    s_new = health_score(newest)
    s_old = health_score(oldest)
    assert s_new < s_old < s_base
    assert abs(s_base - s_new) > abs(s_base - s_old)


def test_ring_buffer_orders_oldest_to_newest_and_wraps() -> None:
    hm = HealthMatrix(window=3)
    assert hm.matrix().shape == (6, 0)
    for t in range(5):
        hm.push(float(t), [t, t, t, t, t, t])
    assert hm.full and len(hm) == 3
    np.testing.assert_array_equal(hm.matrix()[0], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(hm.times(), [2.0, 3.0, 4.0])
    with pytest.raises(ValueError):
        hm.push(1.0, [0] * 6)
    with pytest.raises(ValueError):
        hm.push(9.0, [0] * 5)


def test_ring_buffer_score_matches_seed_and_named_push() -> None:
    hm = HealthMatrix()
    for t in range(5):
        hm.push(100.0 + t, {name: row[t] for name, row in SEED_EXAMPLE.items()})
    assert hm.score() == pytest.approx(health_score(SEED_EXAMPLE))
    d = hm.to_dict()
    assert d["disk_pct"] == [None] * 5 and d["cpu_pct"][-1] == 47.0
