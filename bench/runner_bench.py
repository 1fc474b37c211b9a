"""Per-task runner cost: prepare + run `true` + snapshot + remove, old path vs new path.

The runner work the agent does for a one-step trivial task (issue 2's tasks/s goal),
without the ledger: check the task's commit out, run the step, write its log into
the worktree and snapshot the tree, remove the worktree. Variants, in one run:

- old: git CLI worktrees (`worktree add`, `add -A` + `write-tree`, `worktree
  remove` + `prune`) and asyncio's subprocess spawn (fork under uvloop);
- new: pygit2 worktrees in-process and vfork + pidfd spawn (the defaults);
- new + cgroup: the new path with a memory limit, i.e. what a cgroup (mkdir,
  limit write, preexec join, rmdir) costs per step on this host.

Sequential rows interleave the variants task by task, so load on a shared host
hits them alike. The concurrent rows run `--slots` tasks at a time the way the
executor does (worktree calls in worker threads) and report wall-clock tasks/s.

Run: .venv/bin/python -m bench.runner_bench [--tasks 200] [--slots 4] [--loop uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from bench.common import md_table, pct
from kovanex.runner import Limits, detect, run_step, step_env
from kovanex.runner import worktree as wt

PHASES = ("prepare", "run", "snapshot", "remove")


@dataclass(frozen=True)
class Variant:
    name: str
    engine: str
    fast_spawn: bool
    limits: Limits | None = None


@dataclass
class Samples:
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    total: list[float] = field(default_factory=list)


def make_repo(root: Path) -> tuple[Path, str]:
    """A bare repo shaped like a small task repo: a few files, a .gitignore, a spec."""
    src = root / "src"
    src.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@b",
        "GIT_CONFIG_NOSYSTEM": "1",
    }

    def git(*args: str | Path, cwd: Path | None = None) -> str:
        return subprocess.run(
            ["git", *map(str, args)], cwd=cwd, env=env, check=True, capture_output=True, text=True
        ).stdout

    git("init", "-q", src)
    (src / ".kovanex").mkdir()
    (src / ".kovanex" / "task.toml").write_text('[[step]]\nname = "s"\nrun = "true"\n')
    (src / ".gitignore").write_text("*.log\n!.kovanex/logs/*.log\n")
    (src / "README.md").write_text("trivial task\n")
    (src / "src").mkdir()
    for i in range(8):
        (src / "src" / f"m{i}.py").write_text(f"X = {i}\n" * 20)
    git("add", "-A", cwd=src)
    git("commit", "-qm", "init", cwd=src)
    bare = root / "repo.git"
    git("clone", "-q", "--bare", src, bare)
    return bare, git("rev-parse", "HEAD", cwd=src).strip()


async def one_task(
    v: Variant, bare: Path, commit: str, path: Path, logs: Path, threaded: bool
) -> dict[str, float]:
    """One trivial task's runner work, as kovanex/agent/executor.py does it."""

    async def call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kw) if threaded else fn(*args, **kw)

    times: dict[str, float] = {"errors": 0}
    t0 = time.perf_counter()
    for attempt in range(10):
        try:
            await call(wt.prepare, bare, commit, path, engine=v.engine)
            break
        except wt.WorktreeError:
            # The git CLI path races with itself when tasks run concurrently
            # (`worktree add` reads other, half-written admin dirs): counted, retried.
            times["errors"] += 1
            if attempt == 9:
                raise
    t1 = time.perf_counter()
    log_path = logs / f"{path.name}.log"
    out = await run_step(
        "true",
        cwd=path,
        env=step_env({}, {"KOVANEX_WORKTREE": str(path)}, path=os.environ.get("PATH")),
        timeout_s=30.0,
        log_path=log_path,
        limits=v.limits,
        fast_spawn=v.fast_spawn,
    )
    if out.result != "ok":
        raise RuntimeError(f"{v.name}: step {out}")
    t2 = time.perf_counter()
    (path / ".kovanex" / "logs").mkdir(parents=True, exist_ok=True)
    (path / ".kovanex" / "logs" / "1-s.log").write_bytes(log_path.read_bytes() + b"done\n")
    tree = await call(wt.snapshot, path, engine=v.engine)
    t3 = time.perf_counter()
    await call(wt.remove, bare, path, engine=v.engine)
    t4 = time.perf_counter()
    times.update(prepare=t1 - t0, run=t2 - t1, snapshot=t3 - t2, remove=t4 - t3, total=t4 - t0)
    times["tree"] = int(tree, 16)  # type: ignore[assignment]
    return times


async def sequential(
    variants: list[Variant], bare: Path, commit: str, root: Path, n: int
) -> dict[str, Samples]:
    out = {v.name: Samples() for v in variants}
    trees: dict[str, set[int]] = {v.name: set() for v in variants}
    for i in range(n + 5):
        order = variants if i % 2 == 0 else variants[::-1]
        for v in order:
            t = await one_task(v, bare, commit, root / "work" / f"t{i}", root / "logs", False)
            trees[v.name].add(int(t.pop("tree")))
            t.pop("errors")
            if i < 5:  # warm-up: imports, first cgroup, page cache
                continue
            for p in PHASES:
                out[v.name].phases[p].append(t[p])
            out[v.name].total.append(t["total"])
    if len({frozenset(s) for s in trees.values()}) != 1:
        raise RuntimeError(f"variants snapshot different trees: {trees}")
    return out


async def concurrent(
    v: Variant, bare: Path, commit: str, root: Path, n: int, slots: int, tag: int
) -> tuple[float, float, int]:
    """Wall-clock tasks/s, CPU ms/task and prepare errors with `slots` tasks at once.

    CPU is this process (all threads, including the background deleter) plus every
    child it reaped: git commands, `sh -c true`. The clock stops once deferred
    worktree deletion has drained, so the new path cannot hide work after the end.
    """
    sem = asyncio.Semaphore(slots)
    errors = 0

    async def task(i: int) -> None:
        nonlocal errors
        async with sem:
            path = root / "work" / f"c{tag}-{i}"
            errors += int((await one_task(v, bare, commit, path, root / "logs", True))["errors"])

    wt.drain_trash()
    cpu0, t0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(n)))
    await asyncio.to_thread(wt.drain_trash)
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    return n / wall, cpu / n * 1000, errors


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def ms(xs: list[float], p: float) -> str:
    return f"{pct(xs, p) * 1000:.2f}"


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kx-runner-bench-") as d:
        root = Path(d)
        bare, commit = make_repo(root)
        variants = [
            Variant("old (git CLI + asyncio spawn)", wt.GIT_CLI, False),
            Variant("new (pygit2 + vfork/pidfd)", wt.PYGIT2, True),
        ]
        if args.cgroup:
            variants.append(
                Variant(f"new + memory limit ({detect()})", wt.PYGIT2, True, Limits(memory_mb=256))
            )
        seq = await sequential(variants, bare, commit, root, args.tasks)
        conc = {
            v.name: await concurrent(v, bare, commit, root, args.tasks, args.slots, k)
            for k, v in enumerate(variants)
        }
        rows, result = [], {}
        for v in variants:
            s = seq[v.name]
            mean = statistics.fmean(s.total)
            tps_c, cpu_c, errs = conc[v.name]
            rows.append(
                [
                    v.name,
                    *(ms(s.phases[p], 50) for p in PHASES),
                    ms(s.total, 50),
                    ms(s.total, 95),
                    f"{1 / mean:.0f}",
                    f"{tps_c:.0f}",
                    f"{cpu_c:.2f}",
                    str(errs),
                ]
            )
            result[v.name] = {
                "p50_ms": {p: pct(s.phases[p], 50) * 1000 for p in PHASES},
                "total_p50_ms": pct(s.total, 50) * 1000,
                "total_p95_ms": pct(s.total, 95) * 1000,
                "seq_tasks_per_s": 1 / mean,
                "concurrent_tasks_per_s": tps_c,
                "concurrent_cpu_ms_per_task": cpu_c,
                "concurrent_prepare_errors": errs,
            }
        headers = [
            "variant",
            *(f"{p} p50 ms" for p in PHASES),
            "task p50 ms",
            "task p95 ms",
            "tasks/s (1 at a time)",
            f"tasks/s ({args.slots} slots)",
            "CPU ms/task (agent + children)",
            "prepare races",
        ]
        print(
            f"runner per-task cost, {args.tasks} tasks per variant, loop={args.loop}, "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
        )
        print(md_table(headers, rows))
        return result


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    ap.add_argument("--no-cgroup", dest="cgroup", action="store_false")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    runner: Callable[[Coroutine[Any, Any, dict[str, Any]]], dict[str, Any]] = (
        uvloop.run if args.loop == "uvloop" else asyncio.run
    )
    result = runner(main(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(cli())
