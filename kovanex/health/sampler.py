"""The I/O shell around the health matrix: reads psutil and times a real local-state read.

The pure arithmetic lives in `kovanex.core.health`; this module only measures and pushes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil

from kovanex.core.health import METRICS, HealthMatrix

ProbeFn = Callable[[], float]


def stat_read_probe(path: str | os.PathLike[str], nbytes: int = 4096) -> ProbeFn:
    """A probe that times `os.stat` + a small read of `path` (e.g. a ref file), in ms.

    A missing file still costs a stat: the time to learn it is missing is the latency.
    """
    target = Path(path)

    def probe() -> float:
        t0 = time.perf_counter()
        try:
            os.stat(target)
            with open(target, "rb") as fh:
                fh.read(nbytes)
        except OSError:
            pass
        return (time.perf_counter() - t0) * 1000.0

    return probe


def timed(read: Callable[[], object]) -> ProbeFn:
    """Wrap any local-state read (e.g. a pygit2 ref lookup) into a millisecond probe."""

    def probe() -> float:
        t0 = time.perf_counter()
        read()
        return (time.perf_counter() - t0) * 1000.0

    return probe


class Sampler:
    """Samples one health vector (METRICS order) every `interval_s` into a HealthMatrix."""

    def __init__(
        self,
        interval_s: float,
        runner_total: int,
        queue_depth_fn: Callable[[], int],
        runner_free_fn: Callable[[], int],
        db_probe_fn: ProbeFn | None = None,
        data_dir: str | os.PathLike[str] = ".",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.interval_s = interval_s
        self.runner_total = runner_total
        self.queue_depth_fn = queue_depth_fn
        self.runner_free_fn = runner_free_fn
        self.data_dir = Path(data_dir)
        self.db_probe_fn = db_probe_fn or stat_read_probe(self.data_dir / "HEAD")
        self.clock = clock
        # cpu_percent(None) reports usage since the previous call; prime it so the first
        # real sample is not the meaningless 0.0 psutil returns on its first call.
        psutil.cpu_percent(interval=None)

    def sample(self) -> np.ndarray:
        """One vector: cpu %, mem %, disk % of data_dir, db latency ms, queue depth, free runners."""
        vec = np.empty(len(METRICS))
        vec[0] = psutil.cpu_percent(interval=None)
        vec[1] = psutil.virtual_memory().percent
        try:
            vec[2] = psutil.disk_usage(str(self.data_dir)).percent
        except OSError:
            vec[2] = np.nan  # unknown: drops out of the score instead of faking a value
        vec[3] = float(self.db_probe_fn())
        vec[4] = float(self.queue_depth_fn())
        vec[5] = float(self.runner_free_fn())
        return vec

    def sample_into(self, matrix: HealthMatrix) -> np.ndarray:
        vec = self.sample()
        matrix.push(self.clock(), vec)
        return vec

    async def run(self, matrix: HealthMatrix, stop_event: asyncio.Event) -> None:
        """Push a sample now and every interval until `stop_event` is set."""
        while not stop_event.is_set():
            self.sample_into(matrix)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_event.wait(), timeout=self.interval_s)

    def score(self, matrix: HealthMatrix) -> float:
        return matrix.score(runner_total=self.runner_total)
