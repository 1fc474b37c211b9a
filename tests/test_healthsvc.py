"""HealthService: real psutil samples, a real local-state read, a real asyncio loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kovanex.agent.healthsvc import HealthService, status_word
from kovanex.core.health import METRICS, health_score
from tests.agentkit import git, until


def _svc(tmp_path: Path, **kw) -> HealthService:
    args = {
        "runner_total_fn": lambda: 4,
        "runner_free_fn": lambda: 4,
        "queue_depth_fn": lambda: 0,
        "interval_s": 0.01,
    }
    args.update(kw)
    return HealthService(tmp_path, **args)


def test_score_is_real_before_the_loop_runs(tmp_path: Path) -> None:
    svc = _svc(tmp_path)
    assert len(svc) == 0
    s = svc.score()
    assert len(svc) == 1  # took one sample synchronously
    assert 0.0 < s <= 1.0
    vec = svc.vector()
    assert set(vec) == set(METRICS)
    assert vec["runner_free"] == 4 and vec["queue_depth"] == 0
    assert 0 < vec["mem_pct"] <= 100 and vec["db_lat_ms"] > 0
    # The score is the core formula over the same matrix with the live runner total.
    assert s == pytest.approx(health_score(svc.matrix(), runner_total=4))


def test_run_samples_every_interval_oldest_first_and_keeps_the_window(tmp_path: Path) -> None:
    depth = iter(range(10_000))
    svc = _svc(tmp_path, queue_depth_fn=lambda: next(depth), window=3)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(svc.run(stop))
        await until(lambda: svc.vector().get("queue_depth", 0) >= 5)
        stop.set()
        await asyncio.wait_for(task, 5)  # stop ends the loop promptly

    asyncio.run(go())
    rows = svc.matrix()
    assert all(len(r) == 3 for r in rows.values())
    q = rows["queue_depth"]
    assert q == sorted(q) and q[-1] == svc.vector()["queue_depth"] >= 5
    assert list(svc._matrix.times()) == sorted(svc._matrix.times())


def test_load_lowers_the_score(tmp_path: Path) -> None:
    idle = _svc(tmp_path, runner_free_fn=lambda: 4, queue_depth_fn=lambda: 0)
    # load large enough that no cpu swing between the two samples can hide it
    busy = _svc(tmp_path, runner_free_fn=lambda: 0, queue_depth_fn=lambda: 10_000)
    assert busy.score() < idle.score()
    assert status_word(0.74) == "healthy" and status_word(0.5) == "degraded"
    assert status_word(0.1) == "unhealthy"


def test_db_latency_times_a_ref_read_of_a_real_repo(tmp_path: Path) -> None:
    svc = _svc(tmp_path)
    assert svc.probe_target() == tmp_path  # no repo yet: stat of the data dir
    repo = tmp_path / "repos" / "app.git"
    git("init", "-q", "--bare", str(repo))
    assert svc.probe_target() == repo / "HEAD"
    git("pack-refs", "--all", cwd=repo)
    (repo / "packed-refs").write_text("# pack-refs with: peeled fully-peeled sorted \n")
    svc._target = None
    assert svc.probe_target() == repo / "packed-refs"
    assert svc.vector()["db_lat_ms"] > 0
    explicit = tmp_path / "probe"
    explicit.write_bytes(b"x" * 10)
    assert _svc(tmp_path, probe_path=explicit).probe_target() == explicit


def test_node_without_runners_has_no_runner_row(tmp_path: Path) -> None:
    svc = _svc(tmp_path, runner_total_fn=lambda: 0, runner_free_fn=lambda: 0)
    assert "runner_free" not in svc.vector()
    assert "runner_free" not in svc.matrix()
    # the row drops out of the score rather than counting as "every runner busy"
    assert svc.score() == pytest.approx(health_score(svc.matrix()))
    assert svc.score() > 0.0


def test_a_failing_reading_does_not_stop_the_loop(tmp_path: Path) -> None:
    calls = {"n": 0}

    def flaky() -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("queue unavailable")
        return calls["n"]

    svc = _svc(tmp_path, queue_depth_fn=flaky)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(svc.run(stop))
        await until(lambda: len(svc) >= 3)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(go())
    assert 2 not in svc.matrix()["queue_depth"]
    assert calls["n"] >= 4


def test_the_score_follows_every_new_sample_and_the_runner_total(tmp_path: Path) -> None:
    """The score is kept between samples (it is asked at every placement); a new sample or
    another runner total gives the score of the matrix as it is now, never a stale one."""
    state = {"free": 4.0, "total": 4}
    svc = _svc(
        tmp_path,
        runner_free_fn=lambda: state["free"],
        runner_total_fn=lambda: state["total"],
        window=1,
    )
    first = svc.score()
    assert svc.score() == first
    state["free"] = 1.0  # three of four runners busy: the next sample scores otherwise
    svc.sample_now()
    busy = svc.score()
    # not `busy < first`: the sample's CPU and memory are the host's, and beside a CPU hog
    # the first sample's CPU can be the busier one; a stale score would be `first` itself
    assert busy != first and svc.vector()["runner_free"] == 1
    assert busy == pytest.approx(health_score(svc.matrix(), runner_total=4))
    state["total"] = 16  # more runners, same sample: scored against the new total
    assert svc.score() == pytest.approx(health_score(svc.matrix(), runner_total=16))
    assert svc.score() != pytest.approx(busy)
