"""Health matrix: a ring buffer of metric vectors and the score it convolves into.

Pure: the shell (`kovanex.health.sampler`) measures, this module only does arithmetic.
The formula is documented in docs/decisions/0005-health-and-scoring.md:

    G[m, t] = goodness_m(X[m, t])                  per-sample goodness in [0, 1]
    g[m]    = sum_t k[t] G[m, t] / sum_t k[t]      causal kernel, newest weighs most
    score   = prod_m g[m] ** (w[m] / sum w)        weighted geometric mean

NaN cells are "unknown" and drop out of the kernel; a metric with no known cell drops
out of the mean (its weight is renormalised away). That is how the seed's example,
which has no disk row, is scored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

METRICS: tuple[str, ...] = (
    "cpu_pct",
    "mem_pct",
    "disk_pct",
    "db_lat_ms",
    "queue_depth",
    "runner_free",
)
IDX: dict[str, int] = {m: i for i, m in enumerate(METRICS)}

# Weights sum to 1. CPU dominates because it is what tasks consume; runner slots and
# queue depth say how busy the node is; disk and DB latency say whether it is sick.
DEFAULT_WEIGHTS: Mapping[str, float] = {
    "cpu_pct": 0.22,
    "mem_pct": 0.17,
    "disk_pct": 0.13,
    "db_lat_ms": 0.13,
    "queue_depth": 0.175,
    "runner_free": 0.175,
}

# Goodness curve parameters (see the ADR for why these shapes).
UTIL_EXPONENT = 2.0  # cpu/mem/disk: 1 - (pct/100)^2: gentle at low load, steep near full
CPU_FLOOR = 0.1  # a pegged CPU is busy, not broken (full memory or disk is broken: floor 0)
DB_LAT_HALF_MS = 10.0  # db latency at which goodness is 0.5
QUEUE_HALF = 10.0  # queue depth at which goodness is 0.5
RUNNER_FLOOR = 0.2  # all runners busy is "busy", not "broken"
RUNNER_SAT = 0.25  # without a runner total: 1 free slot -> 0.75, 2 -> 0.94
DEFAULT_HALF_LIFE = 1.0  # kernel half-life in samples

Kernel = Sequence[float] | np.ndarray | Callable[[int], np.ndarray]


def decay_kernel(width: int, half_life: float = DEFAULT_HALF_LIFE) -> np.ndarray:
    """Normalised exponential decay, oldest first: weight halves every `half_life` samples back."""
    if width <= 0:
        return np.zeros(0)
    ages = np.arange(width - 1, -1, -1, dtype=float)
    k = 0.5 ** (ages / max(half_life, 1e-9))
    return k / k.sum()


def _kernel_for(kernel: Kernel | None, width: int) -> np.ndarray:
    """Align a kernel to the newest column; older columns beyond its length get weight 0."""
    if kernel is None:
        return decay_kernel(width)
    if callable(kernel):
        k = np.asarray(kernel(width), dtype=float)
    else:
        k = np.asarray(kernel, dtype=float)
    k = np.nan_to_num(np.clip(k, 0.0, None), nan=0.0, posinf=0.0)
    if k.size >= width:
        return k[k.size - width :]
    return np.concatenate([np.zeros(width - k.size), k])


def as_matrix(data: np.ndarray | Mapping[str, Sequence[float]]) -> np.ndarray:
    """Normalise input to a float (len(METRICS) x T) matrix; missing named rows become NaN."""
    if isinstance(data, Mapping):
        unknown = set(data) - set(METRICS)
        if unknown:
            raise ValueError(f"unknown metrics: {sorted(unknown)}")
        widths = {len(v) for v in data.values()}
        if len(widths) > 1:
            raise ValueError("metric rows differ in length")
        width = widths.pop() if widths else 0
        out = np.full((len(METRICS), width), np.nan)
        for name, row in data.items():
            out[IDX[name]] = np.asarray(row, dtype=float)
        return out
    arr = np.asarray(data, dtype=float)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.shape[0] != len(METRICS):
        raise ValueError(f"expected {len(METRICS)} metric rows in METRICS order, got {arr.shape}")
    return arr


def goodness(mat: np.ndarray, runner_total: float | None = None) -> np.ndarray:
    """Map each raw cell to [0, 1] (1 = good); NaN stays NaN (unknown), everything else is sanitised.

    Negative readings are clamped to 0; +inf is the worst value of a "bad" metric and the
    best value of runner_free.
    """
    x = np.clip(np.asarray(mat, dtype=float), 0.0, None)  # NaN survives clip, -inf -> 0
    g = np.empty_like(x)
    with np.errstate(invalid="ignore", over="ignore"):
        util = np.minimum(x[0:3], 100.0) / 100.0
        g[0:3] = 1.0 - util**UTIL_EXPONENT
        g[0] = CPU_FLOOR + (1.0 - CPU_FLOOR) * g[0]
        g[3] = 1.0 / (1.0 + x[3] / DB_LAT_HALF_MS)
        g[4] = 1.0 / (1.0 + x[4] / QUEUE_HALF)
        free = x[5]
        if runner_total is not None and runner_total > 0:
            frac = np.minimum(free / float(runner_total), 1.0)
        else:
            # No total known: saturate. One free slot already means "can take a task now".
            frac = 1.0 - RUNNER_SAT ** np.minimum(free, 1e6)
        g[5] = RUNNER_FLOOR + (1.0 - RUNNER_FLOOR) * frac
    # inf/inf and similar leave NaN only where the input was NaN; keep results in range.
    nan_in = np.isnan(x)
    g = np.where(nan_in, np.nan, np.clip(np.nan_to_num(g, nan=0.0), 0.0, 1.0))
    return g


def metric_goodness(
    data: np.ndarray | Mapping[str, Sequence[float]],
    kernel: Kernel | None = None,
    runner_total: float | None = None,
) -> np.ndarray:
    """Per-metric goodness after the temporal kernel; NaN where a metric has no known sample."""
    g = goodness(as_matrix(data), runner_total)
    width = g.shape[1]
    if width == 0:
        return np.full(len(METRICS), np.nan)
    k = _kernel_for(kernel, width)
    known = ~np.isnan(g)
    kw = known * k  # kernel weight of each known cell
    denom = kw.sum(axis=1)
    num = np.where(known, g, 0.0) @ k
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(denom > 0, num / np.where(denom > 0, denom, 1.0), np.nan)
    return out


def health_score(
    data: np.ndarray | Mapping[str, Sequence[float]],
    weights: Mapping[str, float] = DEFAULT_WEIGHTS,
    kernel: Kernel | None = None,
    runner_total: float | None = None,
) -> float:
    """Collapse a metric matrix (oldest -> newest columns) into one score in [0, 1].

    Weighted geometric mean, not arithmetic: one critical metric (disk full, DB taking
    seconds) must drag the node down, as the scheduler's product score does. A node with
    no known metric scores 0.0: no evidence of health is not health.
    """
    g = metric_goodness(data, kernel, runner_total)
    w = np.array([max(float(weights.get(m, 0.0)), 0.0) for m in METRICS])
    w = np.nan_to_num(w, nan=0.0, posinf=0.0)
    use = ~np.isnan(g) & (w > 0)
    total = w[use].sum()
    if total <= 0:
        return 0.0
    score = float(np.prod(g[use] ** (w[use] / total)))
    if not math.isfinite(score):
        return 0.0
    return min(max(score, 0.0), 1.0)


class HealthMatrix:
    """Ring buffer of the last `window` metric vectors (metrics x window), oldest first on read."""

    def __init__(self, window: int = 5) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._buf = np.full((len(METRICS), window), np.nan)
        self._times = np.full(window, np.nan)
        self._next = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def full(self) -> bool:
        return self._count == self.window

    @property
    def last_time(self) -> float | None:
        if self._count == 0:
            return None
        return float(self._times[(self._next - 1) % self.window])

    def push(self, now: float, vector: Sequence[float] | np.ndarray | Mapping[str, float]) -> None:
        """Append one sample taken at `now`; a sample older than the newest one is refused."""
        last = self.last_time
        if last is not None and now < last:
            raise ValueError(f"sample at {now} is older than the newest one ({last})")
        if isinstance(vector, Mapping):
            col = np.full(len(METRICS), np.nan)
            for name, value in vector.items():
                col[IDX[name]] = float(value)
        else:
            col = np.asarray(vector, dtype=float).reshape(-1)
            if col.size != len(METRICS):
                raise ValueError(f"expected {len(METRICS)} values, got {col.size}")
        self._buf[:, self._next] = col
        self._times[self._next] = now
        self._next = (self._next + 1) % self.window
        self._count = min(self._count + 1, self.window)

    def _order(self) -> np.ndarray:
        start = (self._next - self._count) % self.window
        return (start + np.arange(self._count)) % self.window

    def matrix(self) -> np.ndarray:
        """A copy of the filled columns, oldest -> newest (shape metrics x len(self))."""
        return self._buf[:, self._order()].copy()

    def times(self) -> np.ndarray:
        return self._times[self._order()].copy()

    def score(
        self,
        weights: Mapping[str, float] = DEFAULT_WEIGHTS,
        kernel: Kernel | None = None,
        runner_total: float | None = None,
    ) -> float:
        return health_score(self.matrix(), weights, kernel, runner_total)

    def to_dict(self) -> dict[str, list[float | None]]:
        """Named rows for the GetHealthMatrix view (NaN -> None so it is JSON-safe)."""
        m = self.matrix()
        return {
            name: [None if math.isnan(v) else float(v) for v in m[i]]
            for i, name in enumerate(METRICS)
        }
