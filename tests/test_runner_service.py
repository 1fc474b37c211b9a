"""Service supervision with real processes: restarts with backoff, clean cancel."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil

from kovanex.core.backoff import Backoff
from kovanex.runner import Limits, step_env, supervise
from tests.agentkit import until


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_crashing_service_restarts_with_growing_delays(tmp_path: Path) -> None:
    restarts: list[tuple[int, float]] = []
    starts: list[float] = []

    async def main():
        cancel = asyncio.Event()
        task = asyncio.create_task(
            supervise(
                "echo boot; exit 3",
                cwd=tmp_path,
                env=step_env({}, {}, home=str(tmp_path)),
                log_path=tmp_path / "svc.log",
                limits=Limits(memory_mb=128),
                cancel=cancel,
                backoff=Backoff(base=0.05, factor=2, max=0.4, reset_after=60),
                on_restart=lambda n, d: restarts.append((n, d)),
                on_start=lambda pid: starts.append(time.monotonic()),
            )
        )
        await until(lambda: len(restarts) >= 5)
        cancel.set()
        return await task

    out = asyncio.run(main())
    assert [d for _, d in restarts[:5]] == [0.05, 0.1, 0.2, 0.4, 0.4]
    assert [n for n, _ in restarts] == list(range(1, len(restarts) + 1))
    assert out.restarts == len(restarts) and out.last_exit_code == 3
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    for gap, (_, delay) in zip(gaps, restarts, strict=False):
        assert gap >= delay  # really waited the backoff delay before restarting
    log = (tmp_path / "svc.log").read_text()
    assert log.count("boot") == len(starts)
    assert "restart 1 in 0.05s" in log


def test_cancel_stops_a_running_service_and_leaves_nothing_behind(tmp_path: Path) -> None:
    pids: list[int] = []

    async def main():
        cancel = asyncio.Event()
        task = asyncio.create_task(
            supervise(
                "sleep 300 & echo $! > child.pid; wait",
                cwd=tmp_path,
                env=step_env({}, {}, home=str(tmp_path)),
                log_path=tmp_path / "svc.log",
                limits=None,
                cancel=cancel,
                backoff=Backoff(base=0.05),
                on_restart=None,
                on_start=pids.append,
            )
        )
        await until(lambda: (tmp_path / "child.pid").exists() and bool(pids))
        cancel.set()
        return await asyncio.wait_for(task, 10)

    out = asyncio.run(main())
    assert out.restarts == 0 and out.last_result == "killed"
    child = int((tmp_path / "child.pid").read_text())
    for pid in (pids[0], child):
        assert gone(pid)


def test_cancel_during_the_backoff_delay_returns_promptly(tmp_path: Path) -> None:
    async def main():
        cancel = asyncio.Event()
        restarted = asyncio.Event()
        task = asyncio.create_task(
            supervise(
                "exit 1",
                cwd=tmp_path,
                env=step_env({}, {}, home=str(tmp_path)),
                log_path=tmp_path / "svc.log",
                limits=None,
                cancel=cancel,
                backoff=Backoff(base=60, max=60),
                on_restart=lambda n, d: restarted.set(),
            )
        )
        await asyncio.wait_for(restarted.wait(), 10)
        t0 = time.monotonic()
        cancel.set()
        out = await asyncio.wait_for(task, 10)
        return out, time.monotonic() - t0

    out, took = asyncio.run(main())
    assert out.restarts == 1 and out.last_exit_code == 1
    assert took < 5  # not the 60 s backoff
