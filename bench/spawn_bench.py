"""What one child costs the agent (ADR 0109): asyncio's subprocess on uvloop (a fork of
the whole agent) against `proc.spawn` (a vfork in a spawner thread, exit by pidfd).

In one process the size of an agent (its imports and a touched heap of `--heap-mb`), on
uvloop as the agent runs, each variant starts `/bin/true` with three pipes `--runs`
times, interleaved run by run so load hits both alike. Reported per child: the wall time
the caller waited for the start (for uvloop's fork, the event loop stood still for it),
and the parent's own CPU (getrusage), the page-table copy included.

Run: .venv/bin/python -m bench.spawn_bench [--runs 200] [--heap-mb 80]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time

import uvloop

from bench.common import md_table
from kovanex import proc


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def by_asyncio() -> None:
    p = await asyncio.create_subprocess_exec(
        "/bin/true",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        cwd="/",
    )
    await p.communicate()


async def by_proc() -> None:
    p = await proc.spawn(["/bin/true"])
    await p.communicate()


async def measure(runs: int) -> dict[str, tuple[list[float], float]]:
    out: dict[str, tuple[list[float], float]] = {
        "asyncio (uvloop)": ([], 0.0),
        "proc.spawn": ([], 0.0),
    }
    for _ in range(runs):
        for name, start in (("asyncio (uvloop)", by_asyncio), ("proc.spawn", by_proc)):
            walls, used = out[name]
            c, t = cpu(), time.perf_counter()
            await start()
            walls.append(time.perf_counter() - t)
            out[name] = (walls, used + cpu() - c)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--heap-mb", type=int, default=80)
    a = ap.parse_args()
    import kovanex.agent.daemon  # noqa: F401 - an agent's imports

    heap = bytearray(a.heap_mb << 20)
    for i in range(0, len(heap), 4096):
        heap[i] = 1  # resident, as an agent's heap is
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res = uvloop.run(measure(a.runs))
    rows = [
        [
            name,
            f"{1000 * statistics.median(walls):.2f}",
            f"{1000 * sorted(walls)[int(0.95 * len(walls))]:.2f}",
            f"{1000 * used / len(walls):.2f}",
        ]
        for name, (walls, used) in res.items()
    ]
    print(f"parent RSS {rss:.0f} MB, load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    print(md_table(["variant", "start+exit p50 ms", "p95 ms", "parent CPU ms/child"], rows))


if __name__ == "__main__":
    main()
