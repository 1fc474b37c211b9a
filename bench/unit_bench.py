"""Step start cost with a compute unit vs without (issue 22 part 2, goal <= 1.5x).

Runs `true` through run_step, interleaved run by run so load hits every variant alike:

- agent: as the agent's user in the node's work dir, no limits;
- unit: as a unit user, forked by the node's step zygote (ADR 0081, no pygit2, as the
  agent runs it): the child joins the unit's cgroups, joins the task's mount namespace
  (its own /tmp, ADR 0083), drops and execs the step's shell; cwd in the task's work
  dir (ADR 0073); no limits;
- agent + mem: the agent path with a 256 MiB memory cgroup per step;
- unit + mem: the unit path with the same limit (on the unit's delegated cgroup);
- "… setpriv": the fallback without a zygote (a root wrapper shell makes the mount
  namespace, setpriv drops), what every unit step did before the zygote;
- "unit, zygote with pygit2": the same from a zygote that imported pygit2 (the git
  zygote's size: what one zygote for everything would cost a step).

The ratio is unit / agent for the same limits. Needs root (units are users).

Run: .venv/bin/python -m bench.unit_bench [--runs 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import md_table, pct
from kovanex.runner import Limits, taskdirs
from kovanex.runner import units as unitsmod
from kovanex.runner.process import run_step
from kovanex.runner.zygoteclient import Zygote


async def _once(
    cwd: Path, log: Path, limits: Limits | None, unit: unitsmod.Unit | None, z: Zygote | None
) -> float:
    t0 = time.perf_counter()
    out = await run_step(
        "true",
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        timeout_s=30,
        log_path=log,
        limits=limits,
        unit=unit,
        zygote=z,
    )
    dt = (time.perf_counter() - t0) * 1000
    if out.result != "ok":
        raise SystemExit(f"step failed: {out} (see {log})")
    return dt


async def main(runs: int) -> None:
    if os.geteuid() != 0:
        raise SystemExit("unit_bench needs root: units are Linux users")
    base = Path(tempfile.mkdtemp(prefix="kovanex-unit-bench-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    node = f"b{uuid.uuid4().hex[:6]}"
    units = unitsmod.units_for(node, 1, mode=unitsmod.USERS, root=str(base / "u"), create=True)
    unit = units[0]
    task = taskdirs.open_task(unit, "bench", 64).work  # as the executor opens a task
    work = base / "node" / "work"
    work.mkdir(parents=True)
    mem = Limits(memory_mb=256)
    zygote, big = Zygote(git=False), Zygote()
    variants = {
        "agent": (work, None, None, None),
        "unit": (task, None, unit, zygote),
        "agent + mem": (work, mem, None, None),
        "unit + mem": (task, mem, unit, zygote),
        "unit, setpriv": (task, None, unit, None),
        "unit + mem, setpriv": (task, mem, unit, None),
        "unit, zygote with pygit2": (task, None, unit, big),
    }
    samples: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for _ in range(10):  # warm-up: page cache, cgroup dirs, setpriv binary
            for name, (cwd, lim, u, z) in variants.items():
                await _once(cwd, base / f"{name}.log", lim, u, z)
        for _ in range(runs):
            for name, (cwd, lim, u, z) in variants.items():
                samples[name].append(await _once(cwd, base / f"{name}.log", lim, u, z))
    finally:
        zygote.close()
        big.close()
        taskdirs.remove_units(units, delete_users=True)
        shutil.rmtree(base, ignore_errors=True)
    rows = []
    pairs = [(n, "agent + mem" if "mem" in n else "agent") for n in variants if "unit" in n]
    for name, anchor in pairs:
        a, b = samples[anchor], samples[name]
        rows.append(
            [
                name,
                f"{pct(b, 50):.2f}",
                f"{pct(b, 95):.2f}",
                anchor,
                f"{pct(a, 50):.2f}",
                f"{pct(a, 95):.2f}",
                f"**{pct(b, 50) / pct(a, 50):.2f}**",
                f"{pct(b, 95) / pct(a, 95):.2f}",
            ]
        )
    heads = ["variant", "p50 ms", "p95 ms", "anchor", "p50 ms", "p95 ms", "ratio p50", "ratio p95"]
    print(f"step start cost, `true` via run_step, {runs} runs each, interleaved; goal <= 1.5x")
    print(md_table(heads, rows))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    args = ap.parse_args()
    asyncio.run(main(args.runs))
    sys.exit(0)
