"""The sampler with real psutil readings and a real file-read probe."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from kovanex.core.health import IDX, HealthMatrix
from kovanex.health import Sampler, stat_read_probe


def _sampler(tmp_path: Path, interval_s: float = 0.01) -> Sampler:
    (tmp_path / "HEAD").write_text("ref: refs/heads/main\n")
    queue = iter(range(1000))
    return Sampler(
        interval_s=interval_s,
        runner_total=4,
        queue_depth_fn=lambda: next(queue),
        runner_free_fn=lambda: 3,
        data_dir=tmp_path,
    )


def test_sample_values_are_real_and_in_range(tmp_path: Path) -> None:
    vec = _sampler(tmp_path).sample()
    assert vec.shape == (6,)
    for name in ("cpu_pct", "mem_pct", "disk_pct"):
        assert 0.0 <= vec[IDX[name]] <= 100.0, name
    assert vec[IDX["mem_pct"]] > 0.0  # a running machine uses some memory
    assert vec[IDX["disk_pct"]] > 0.0
    assert 0.0 < vec[IDX["db_lat_ms"]] < 1000.0
    assert vec[IDX["queue_depth"]] == 0.0 and vec[IDX["runner_free"]] == 3.0


def test_probe_times_a_real_read(tmp_path: Path) -> None:
    f = tmp_path / "ref"
    f.write_bytes(b"x" * 100)
    assert stat_read_probe(f)() > 0.0
    assert stat_read_probe(tmp_path / "missing")() > 0.0


def test_run_fills_the_matrix_until_stopped(tmp_path: Path) -> None:
    sampler = _sampler(tmp_path, interval_s=0.005)
    hm = HealthMatrix(window=3)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(sampler.run(hm, stop))
        while len(hm) < 3 or hm.matrix()[IDX["queue_depth"], -1] < 4:
            await asyncio.sleep(0)  # yield to the sampler; progress is the condition
        stop.set()
        await asyncio.wait_for(task, timeout=5)

    asyncio.run(main())
    m = hm.matrix()
    assert hm.full and m.shape == (6, 3)
    assert np.all(np.diff(hm.times()) >= 0)
    assert np.all(np.diff(m[IDX["queue_depth"]]) == 1)  # consecutive samples, oldest first
    assert 0.0 < sampler.score(hm) <= 1.0
