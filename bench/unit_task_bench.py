"""A trivial task's runner work in a compute unit, phase by phase (issue 22 part 1).

One unit, one small repo, N tasks one after another, each as the executor does it:
open the task's dirs (per-task state, where the code has it), prepare the checkout,
run `true` as the unit, snapshot, close the task. Reports p50/p95 per phase and the
CPU (this process + reaped children) per task. Runs on the code on PYTHONPATH, so the
same file measures the code before per-task state (clone reuse) and after it.

With the node's zygote (issue 22 part 2, ADR 0081; `--no-zygote` for the setpriv path of
the same code), the CPU per task also counts the zygote's (its own and its reaped
children's, from /proc), since those children are not this process's.

Needs root (units are users). Run: .venv/bin/python -m bench.unit_task_bench [--tasks 100]
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
from bench.runner_bench import make_repo
from kovanex.runner import unitrepo
from kovanex.runner import units as unitsmod
from kovanex.runner.process import run_step

try:
    from kovanex.runner import taskdirs
except ImportError:  # the code before per-task state
    taskdirs = None  # type: ignore[assignment]
try:
    from kovanex.runner.zygoteclient import Zygote
except ImportError:  # the code before the zygote
    Zygote = None  # type: ignore[assignment,misc]
DISK_MB = 1024  # [units] disk_mb's default: the task's dirs are a tmpfs of this size

PHASES = ("open", "prepare", "run", "snapshot", "close")


def _cpu(zygotes: tuple = ()) -> float:
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    for z in zygotes:
        with open(f"/proc/{z.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        own += ticks / os.sysconf("SC_CLK_TCK")
    return own


async def _task(
    unit: unitsmod.Unit, bare: Path, commit: str, log: Path, zygotes: tuple = ()
) -> dict[str, float]:
    """One task; `zygotes`: (step zygote, git zygote), as the agent runs them, or ()."""
    zygote, git = zygotes or (None, None)
    z = {"zygote": zygote} if zygote is not None else {}
    zg = {"zygote": git} if git is not None else {}
    t = [time.perf_counter()]
    dirs = taskdirs.open_task(unit, "demo", DISK_MB) if taskdirs else None
    t.append(time.perf_counter())
    clone = await asyncio.to_thread(
        lambda: unitrepo.prepare(bare, commit, unit, "demo", **zg)  # type: ignore[arg-type]
    )
    t.append(time.perf_counter())
    home = str(dirs.home) if dirs else str(unit.path)
    out = await run_step(
        "true",
        cwd=clone,
        env={"PATH": "/usr/bin:/bin", "HOME": home},
        timeout_s=30,
        log_path=log,
        unit=unit,
        **z,  # type: ignore[arg-type]
    )
    if out.result != "ok":
        raise SystemExit(f"step failed: {out} (see {log})")
    t.append(time.perf_counter())
    await asyncio.to_thread(
        lambda: unitrepo.snapshot(clone, unit, bare, commit, **zg)  # type: ignore[arg-type]
    )
    t.append(time.perf_counter())
    if zygote is not None:
        zygote.forget(unit.uid)  # type: ignore[attr-defined]  # as the executor does
    if taskdirs:
        taskdirs.close_task(unit)  # inline, as the executor does
        unitrepo.forget(unit, "demo", bare)
    t.append(time.perf_counter())
    return {p: (t[i + 1] - t[i]) * 1000 for i, p in enumerate(PHASES)}


async def main(tasks: int, use_zygote: bool = True) -> None:
    if os.geteuid() != 0:
        raise SystemExit("unit_task_bench needs root: units are Linux users")
    base = Path(tempfile.mkdtemp(prefix="kovanex-unit-task-bench-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    bare, commit = make_repo(base)
    node = f"b{uuid.uuid4().hex[:6]}"
    units = unitsmod.units_for(node, 1, mode=unitsmod.USERS, root=str(base / "u"), create=True)
    samples: dict[str, list[float]] = {p: [] for p in (*PHASES, "total")}
    zygotes = (Zygote(git=False), Zygote()) if Zygote is not None and use_zygote else ()
    try:
        for _ in range(5):  # warm-up
            await _task(units[0], bare, commit, base / "step.log", zygotes)
        cpu0 = _cpu(zygotes)
        for _ in range(tasks):
            one = await _task(units[0], bare, commit, base / "step.log", zygotes)
            for p, v in one.items():
                samples[p].append(v)
            samples["total"].append(sum(one.values()))
        cpu = (_cpu(zygotes) - cpu0) / tasks * 1000
    finally:
        for zy in zygotes:
            zy.close()
        # remove_units moved to taskdirs (issue 25); older code has units.remove
        remove = getattr(taskdirs, "remove_units", None) or unitsmod.remove
        remove(units, delete_users=True)
        shutil.rmtree(base, ignore_errors=True)
    rows = [[p, f"{pct(s, 50):.2f}", f"{pct(s, 95):.2f}"] for p, s in samples.items()]
    per_task = "per-task dirs" if taskdirs else "clone reuse"
    per_task += ", zygotes" if zygotes else ", setpriv"
    print(
        f"unit task cost ({per_task}), {tasks} tasks, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}; CPU {cpu:.2f} ms/task (agent + children)"
    )
    print(md_table(["phase", "p50 ms", "p95 ms"], rows))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--no-zygote", action="store_true", help="the setpriv path (no zygote)")
    args = ap.parse_args()
    asyncio.run(main(args.tasks, not args.no_zygote))
    sys.exit(0)
