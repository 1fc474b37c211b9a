"""Seed sweeps of the whole-cluster simulator on every core: each seed is independent and
deterministic, so `make test` can run its hundreds of seeds in worker processes and the
per-seed tests only read their verdicts (same seeds, same checks, half the wall time on
the 2-core CI box). Kept apart from conftest so that workers import nothing of pytest's."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from kovanex.sim.run import simulate


def verdict(seed: int, opts: dict[str, Any]) -> str | None:
    """None when every invariant holds for the seed, else what failed and how to replay it."""
    r = simulate(seed, **opts)
    if r.ok:
        return None
    flag = f" --ownership {opts['ownership']}" if opts.get("ownership") else ""
    return "\n".join(
        [
            r.scenario.describe(),
            *r.violations,
            f"replay: python -m kovanex.sim --seed {seed}{flag} --log",
        ]
    )


def sweep(seeds: Iterable[int], **opts: Any) -> dict[int, str | None]:
    """Each seed's verdict. Workers are spawned, not forked: the test process has threads
    (event readers, agent helpers) that a fork would copy mid-lock."""
    seeds = list(seeds)
    workers = min(len(seeds), os.cpu_count() or 1)
    if workers <= 1:
        return {s: verdict(s, opts) for s in seeds}
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        chunk = max(1, len(seeds) // (workers * 8))
        got = pool.map(verdict, seeds, [opts] * len(seeds), chunksize=chunk)
        return dict(zip(seeds, got, strict=True))
