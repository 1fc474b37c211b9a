"""Issue 22 part 7: what tasks freed goes back to the system once the node is idle.

A task's libgit2 work in worker threads leaves freed memory in glibc's per-thread arenas
(~13 MB after eight pushes on a repo with 10,000 archived tasks). `trim_heap` gives it
back; `IdleTrim` does that once after the last run ends, never while a run is going."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from kovanex.agent.heaptrim import IdleTrim, trim_heap
from tests.agentkit import wait_for


def anon_mb() -> float:
    """This process's anonymous memory, MiB (what the heap costs the host)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no Anonymous line in smaps_rollup")


def test_trim_heap_gives_back_what_a_worker_thread_freed() -> None:
    kept: list[bytes] = []

    def work() -> None:
        # 1 KiB blocks come from malloc (not pymalloc), in this thread's arena; every
        # 16th stays alive, so the arena cannot shrink from its top by itself
        blocks = [bytes(1024) + bytes([i % 256]) for i in range(80_000)]
        kept.extend(blocks[::16])
        del blocks

    t = threading.Thread(target=work)
    t.start()
    t.join()
    held = anon_mb()
    assert trim_heap(), "not glibc: nothing here to trim"
    given_back = held - anon_mb()
    assert given_back > 20, f"only {given_back:.1f} MiB of ~70 freed MiB went back"
    assert len(kept) == 5000


def test_idle_trim_runs_once_after_the_last_run_and_never_while_one_runs() -> None:
    busy = [False]
    trim = IdleTrim(lambda: busy[0], settle_s=0.05)

    async def go() -> None:
        for _ in range(5):  # a burst of runs ending: one trim, after the last
            trim.idle()
        await asyncio.to_thread(wait_for, lambda: trim._timer is None, 10, "the trim fired")
        assert trim.trims == 1
        busy[0] = True  # a run started before the settle time was over: no trim
        trim.idle()
        await asyncio.to_thread(wait_for, lambda: trim._timer is None, 10, "the timer fired")
        assert trim.trims == 1
        busy[0] = False
        trim.idle()
        trim.cancel()  # the agent stops: nothing left scheduled
        assert trim._timer is None

    asyncio.run(go())
    assert trim.trims == 1


@pytest.fixture(autouse=True)
def _glibc_only() -> None:
    if not Path("/proc/self/smaps_rollup").exists():
        pytest.skip("needs Linux /proc")
