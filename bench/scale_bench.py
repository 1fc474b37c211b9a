"""Issue 11 part 5: what one repo costs with 0, 1,000 and 10,000 finished tasks.

For each size, a node with one repo holding that many finished tasks (written with git
fast-import by bench/seed.py, dated 30 days ago: older than the default archive age), and
beside it a plain bare repo holding the same refs (refs packed, as `git gc` leaves them):
- push p50/p95 over a local path, Kovanex vs plain, alternated push by push, each pushed
  task waited for until it succeeded (a running task competes with the next push);
- idle CPU and RSS of the agent and its children, 5 s after the last task, over 10 s;
- restart-to-ready (SIGTERM, start, until the agent wrote its pid file: every task
  reconciled and hooks listening);
- `kovanex task list` and `kovanex task show` wall time, next to the CLI's own start
  (`kovanex --version`), which no listing can beat.

The agent is given time to finish its first housekeeping pass (archive + git maintenance)
before anything is measured, when it has one (`upkeep_runs` in `kovanex status`).

Run: .venv/bin/python -m bench.scale_bench [--sizes 0,1000,10000] [--pushes 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pygit2

from bench.common import (
    cpu_of,
    install_cleanup,
    kx,
    md_table,
    p50,
    pct,
    rss_mb,
    run_agent,
    sandbox,
    sh,
    start_agent,
    stop,
    task_clone,
    wait,
)
from bench.seed import seed

SPEC = '[[steps]]\nname = "s"\nrun = "true"\n'
IDLE_AFTER_S = 5.0
IDLE_OVER_S = 10.0


def wall(*cmd: str, runs: int = 5) -> float:
    """Median wall time of a command."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return p50(times)


def status(data: Path) -> dict:
    return json.loads(kx(data, "status", "--format", "json"))


def succeeded(repo: pygit2.Repository, ref: str) -> bool:
    r = repo.references.get(ref)
    return r is not None and "Kovanex-State: succeeded" in repo[r.target].message


def measure(tmp: Path, n: int, pushes: int) -> dict[str, float]:
    data = tmp / f"n{n}"
    name = f"sc{os.getpid() % 100000}n{n}"  # unique on a shared host (units lock names)
    kx(data, "init", "--name", name, "--bind", "127.0.0.1:0", "--runners", "2")
    kx(data, "repo", "create", "bench")
    repo = data / "repos" / "bench.git"
    plain = tmp / f"plain{n}.git"
    sh("git", "init", "-q", "--bare", str(plain))
    seed(repo, n)
    seed(plain, n)
    sh("git", "--git-dir", str(plain), "pack-refs", "--all")
    out: dict[str, float] = {}

    t0 = time.perf_counter()
    agent = start_agent(data, name, 2)
    out["start"] = time.perf_counter() - t0
    # the first housekeeping pass (if this code has one) is not what we measure
    wait(lambda: status(data).get("upkeep_runs", 2) >= 2, 600)

    work = tmp / f"w{n}"
    task_clone(work, SPEC)
    pg = pygit2.Repository(str(repo))
    plain_t, kx_t = [], []
    for i in range(pushes):
        sh("git", "commit", "-q", "--allow-empty", "-m", f"p{i}", cwd=work)
        sh("git", "branch", "-q", f"task/p{i}", cwd=work)
        for target, acc in ((plain, plain_t), (repo, kx_t)):
            t0 = time.perf_counter()
            sh("git", "push", "-q", str(target), f"task/p{i}", cwd=work)
            acc.append(time.perf_counter() - t0)
        wait(lambda i=i: succeeded(pg, f"refs/heads/task/p{i}"), 60)
    out.update(push_kx=p50(kx_t), push_plain=p50(plain_t))
    out.update(push_kx95=pct(kx_t, 95), push_plain95=pct(plain_t, 95))

    time.sleep(IDLE_AFTER_S)  # "5 s after the last task": a measurement, not sync
    out["cpu"] = 100 * cpu_of([agent.pid], IDLE_OVER_S)
    out["rss"] = rss_mb(agent.pid)

    kxcmd = [sys.executable, "-m", "kovanex", "--data", str(data)]
    out["cli"] = wall(*kxcmd, "--version")
    out["list"] = wall(*kxcmd, "task", "list")
    out["show"] = wall(*kxcmd, "task", "show", f"old{n // 2}" if n else "p0")

    restarts = []
    for _ in range(3):
        stop(agent)
        t0 = time.perf_counter()
        agent = run_agent(data)
        restarts.append(time.perf_counter() - t0)
    out["restart"] = p50(restarts)
    time.sleep(IDLE_AFTER_S)  # settle, then the steady state: history already read once
    out["rss_restarted"] = rss_mb(agent.pid)
    stop(agent)
    return out


def table(res: dict[int, dict[str, float]]) -> str:
    rows = []
    for n, r in res.items():
        at = f"@{n}"
        big = n >= 10000
        rows += [
            [
                f"push p50 ms {at}",
                f"{1000 * r['push_kx']:.1f}",
                f"{1000 * r['push_plain']:.1f} plain",
                f"{r['push_kx'] / r['push_plain']:.2f}",
                "≤1.3×" if big else "",
            ],
            [
                f"push p95 ms {at}",
                f"{1000 * r['push_kx95']:.1f}",
                f"{1000 * r['push_plain95']:.1f} plain",
                f"{r['push_kx95'] / r['push_plain95']:.2f}",
                "",
            ],
            [f"push ratio p50 {at}", f"{r['push_kx'] / r['push_plain']:.2f}", "", "", ""],
            [f"idle CPU % {at}", f"{r['cpu']:.2f}", "", "", "≤1" if big else ""],
            [f"idle RSS MB {at}", f"{r['rss']:.1f}", "", "", "≤80" if big else ""],
            [f"idle RSS after a restart MB {at}", f"{r['rss_restarted']:.1f}", "", "", ""],
            [f"first start s {at}", f"{r['start']:.2f}", "", "", ""],
            [f"restart-to-ready s {at}", f"{r['restart']:.2f}", "", "", "≤1" if big else ""],
            [
                f"task list s {at}",
                f"{r['list']:.3f}",
                f"{r['cli']:.3f} CLI start",
                f"{r['list'] / r['cli']:.2f}",
                "≤0.2" if big else "",
            ],
            [
                f"task show s {at}",
                f"{r['show']:.3f}",
                f"{r['cli']:.3f} CLI start",
                f"{r['show'] / r['cli']:.2f}",
                "",
            ],
        ]
    return md_table(["figure", "kovanex", "anchor", "ratio", "goal"], rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0,1000,10000")
    ap.add_argument("--pushes", type=int, default=15)
    a = ap.parse_args()
    install_cleanup()
    tmp = sandbox("kx-scale-")
    res = {}
    for n in (int(x) for x in a.sizes.split(",")):
        print(f"bench: {n} finished tasks ...", file=sys.stderr, flush=True)
        res[n] = measure(tmp, n, a.pushes)
    print(f"load average {os.getloadavg()[0]:.2f} (shared host)", file=sys.stderr)
    print(table(res))


if __name__ == "__main__":
    main()
