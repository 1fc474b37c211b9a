"""The agent's health loop: samples this node into a HealthMatrix and scores it.

The placer reads `score()`, gossip publishes `vector()` and `score()`, and the
`health` control op shows `matrix()`. Arithmetic lives in `kovanex.core.health`,
measuring in `kovanex.health.sampler`; this only wires them to the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kovanex.clock import SYSTEM, Clock
from kovanex.core.health import METRICS, HealthMatrix
from kovanex.health.sampler import Sampler

log = logging.getLogger("kovanex.health")

# Files that say what a repo's refs are; reading one is the node's "DB read".
STATE_FILES = ("packed-refs", "HEAD")


def status_word(score: float) -> str:
    """One word for a score, as in the seed's `health_score = 0.74 (healthy)`."""
    if score >= 0.7:
        return "healthy"
    if score >= 0.4:
        return "degraded"
    return "unhealthy"


class HealthService:
    """Owns one HealthMatrix and the Sampler that fills it."""

    def __init__(
        self,
        data_dir: Path,
        runner_total_fn: Callable[[], int],
        runner_free_fn: Callable[[], float],
        queue_depth_fn: Callable[[], float],
        probe_path: Path | None = None,
        interval_s: float = 1.0,
        window: int = 5,
        clock: Clock = SYSTEM,
    ) -> None:
        self.clock = clock
        self.data_dir = Path(data_dir)
        self.runner_total_fn = runner_total_fn
        self.probe_path = Path(probe_path) if probe_path is not None else None
        self.interval_s = interval_s
        self._matrix = HealthMatrix(window)
        # the score is a pure function of the samples and the runner total, asked for at
        # every placement (a numpy pass over the matrix: the largest share of a one-node
        # placement, bench/README.md): computed once per (samples taken, total)
        self._samples = 0
        self._scored: tuple[tuple[int, int], float] | None = None
        self._target: Path | None = None
        self.sampler = Sampler(
            interval_s=interval_s,
            runner_total=0,  # read live through runner_total_fn at scoring time
            queue_depth_fn=queue_depth_fn,
            runner_free_fn=lambda: self._runner_free(runner_free_fn),
            db_probe_fn=self._probe,
            data_dir=self.data_dir,
        )

    # -- measuring ---------------------------------------------------------------------
    def _runner_free(self, fn: Callable[[], float]) -> float:
        """A node without runner slots (storage, server) has no runner row: it drops out
        of the score instead of counting as "all runners busy"."""
        return math.nan if self.runner_total_fn() <= 0 else float(fn())

    def probe_target(self) -> Path:
        """The file (or, failing that, dir) whose read is timed as db_lat_ms.

        An explicit probe_path wins; otherwise a state file of the first repo under
        data_dir/repos; with no repo yet, the data dir itself (a stat).
        """
        if self.probe_path is not None:
            return self.probe_path
        if self._target is not None and self._target.exists():
            return self._target
        repos = self.data_dir / "repos"
        with contextlib.suppress(OSError):
            for repo in sorted(repos.glob("*.git")):
                for name in STATE_FILES:
                    if (repo / name).is_file():
                        self._target = repo / name
                        return self._target
        self._target = None
        return self.data_dir

    def _probe(self) -> float:
        """Milliseconds to stat and read the target: the local-state read latency."""
        target = self.probe_target()
        t0 = time.perf_counter()
        try:
            st = os.stat(target)
            if not os.path.isdir(target):
                with open(target, "rb") as fh:
                    fh.read(min(st.st_size, 65536) or 1)
        except OSError:
            pass  # learning that it is gone still took this long
        return (time.perf_counter() - t0) * 1000.0

    def sample_now(self) -> np.ndarray:
        """Take one sample into the matrix; time never runs backwards in the matrix."""
        vec = self.sampler.sample()
        last = self._matrix.last_time
        now = self.clock.time()
        self._matrix.push(now if last is None else max(now, last), vec)
        self._samples += 1
        return vec

    async def run(self, stop: asyncio.Event) -> None:
        """Sample now and every interval until `stop` is set; a failed sample is logged."""
        while not stop.is_set():
            try:
                self.sample_now()
            except Exception:  # noqa: BLE001 - a bad reading must not end health reporting
                log.exception("health sample failed")
            with contextlib.suppress(TimeoutError):
                await self.clock.wait_for(stop.wait(), self.interval_s)

    # -- reading -----------------------------------------------------------------------
    def _ensure(self) -> None:
        if len(self._matrix) == 0:
            self.sample_now()  # real from the first call, not an optimistic default

    def __len__(self) -> int:
        return len(self._matrix)

    def score(self) -> float:
        """Health score in [0, 1] of the current window, with the live runner total."""
        self._ensure()
        total = self.runner_total_fn()
        key = (self._samples, total)
        if self._scored is None or self._scored[0] != key:
            score = self._matrix.score(runner_total=total if total > 0 else None)
            self._scored = (key, score)
        return self._scored[1]

    def vector(self) -> dict[str, float]:
        """The newest sample by metric name; unknown (NaN) metrics are left out."""
        self._ensure()
        col = self._matrix.matrix()[:, -1]
        return {m: float(v) for m, v in zip(METRICS, col, strict=True) if not math.isnan(v)}

    def matrix(self) -> dict[str, list[float | None]]:
        """Rows by metric, oldest -> newest; rows with no known cell are left out and
        an unknown cell inside a row is None (JSON-safe)."""
        self._ensure()
        return {
            k: row for k, row in self._matrix.to_dict().items() if any(v is not None for v in row)
        }

    def report(self) -> dict[str, object]:
        """What the `health` control op returns for this node."""
        return {"score": self.score(), "vector": self.vector(), "matrix": self.matrix()}
