"""Issue 2 benchmarks: push cost, push-to-first-step latency, trivial tasks/s, idle RSS.

Each figure runs beside its anchor in the same run:
- push to a Kovanex repo vs push to a plain bare repo (interleaved, same commits);
- trivial tasks/s vs the floor: spawn `true` + three CAS'd transition commits with pygit2.

Run: .venv/bin/python -m bench.push_bench [--pushes 40] [--tasks 100]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pygit2

from bench.common import (
    install_cleanup,
    kx,
    md_table,
    p50,
    pct,
    run_agent,
    sandbox,
    sh,
    step_writable,
    stop,
    wait,
)


def show(data: Path, task: str) -> dict:
    return json.loads(kx(data, "task", "show", task, "--format", "json"))


TOKEN = "bench-token"


def start_http_agent(data: Path, name: str, runners: int | None) -> subprocess.Popen:
    """`init` defaults (runners unless given) and a known token, so pushes go over HTTP."""
    more = [] if runners is None else ["--runners", str(runners)]
    kx(data, "init", "--name", name, "--bind", "127.0.0.1:0", "--token", TOKEN, *more)
    return run_agent(data)


def http_url(data: Path, repo: str) -> str:
    """The agent's smart-HTTP URL for `repo`, with the cluster token as the password."""
    bind = (data / "kovanex.toml").read_text().split("[http]")[1].split('bind = "')[1].split('"')[0]
    return f"http://kx:{TOKEN}@{bind}/git/{repo}.git"


def bench_push(tmp: Path, data: Path, n: int, same_refs: bool = True) -> dict:
    plain = tmp / "plain.git"
    sh("git", "init", "-q", "--bare", str(plain))
    kx(data, "repo", "create", "bench")
    kxrepo = data / "repos" / "bench.git"
    work = tmp / "w"
    sh("git", "init", "-q", str(work))
    (work / ".kovanex").mkdir()
    stamp = step_writable(tmp / "stamps")
    plain_t, kx_t, first_step = [], [], []
    for i in range(n):
        spec = f'[[steps]]\nname = "s"\nrun = "date +%s.%N > {stamp}/{i}"\n'
        (work / ".kovanex" / "task.toml").write_text(spec)
        sh("git", "add", "-A", cwd=work)
        sh("git", "commit", "-q", "--allow-empty", "-m", f"t{i}", cwd=work)
        sh("git", "branch", "-q", f"task/p{i}", cwd=work)
        # issue 11: the anchor is "a plain bare repo holding the same refs". Kovanex's
        # branches end in the agent's commits, which the pusher lacks, so a push to it
        # negotiates with fewer common commits than one to a repo of the pusher's own.
        if same_refs:
            sh("git", "--git-dir", str(plain), "fetch", "-q", str(kxrepo), "+refs/*:refs/*")
        for target, acc in ((plain, plain_t), (kxrepo, kx_t)):
            t0 = time.perf_counter()
            sh("git", "push", "-q", str(target), f"task/p{i}", cwd=work)
            dt = time.perf_counter() - t0
            acc.append(dt)
            if target == kxrepo:
                returned = time.time()
                wait(lambda i=i: (stamp / str(i)).exists() and (stamp / str(i)).read_text(), 30)
                first_step.append(float((stamp / str(i)).read_text()) - returned)
                # let the task finish, and the agent finish cleaning up after it, before the
                # next timed push: on 2 cores a running task competes with the push we time
                wait(lambda: not json.loads(kx(data, "status", "--format", "json"))["running"], 30)
    return {"plain": plain_t, "kovanex": kx_t, "first_step": first_step}


def floor_rate(tmp: Path, n: int) -> float:
    """Issue 11's floor: per task, one spawn of `sh -c true` plus two commits and one ref
    written with pygit2, single-threaded."""
    repo = pygit2.init_repository(str(tmp / "floor.git"), bare=True)
    sig = pygit2.Signature("b", "b@b")
    tree = repo.TreeBuilder().write()
    base = repo.create_commit(None, sig, sig, "base", tree, [])
    t0 = time.perf_counter()
    for i in range(n):
        subprocess.run(["sh", "-c", "true"], check=True)
        parent = base
        for state in ("running", "succeeded"):
            parent = repo.create_commit(
                None, sig, sig, f"{state}\n\nKovanex-State: {state}", tree, [parent]
            )
        repo.references.create(f"refs/heads/task/f{i}", parent)
    return n / (time.perf_counter() - t0)


def bench_throughput(tmp: Path, data: Path, n: int) -> float:
    kx(data, "repo", "create", "tput")
    work = tmp / "tw"
    sh("git", "init", "-q", str(work))
    (work / ".kovanex").mkdir()
    (work / ".kovanex" / "task.toml").write_text('[[steps]]\nname = "t"\nrun = "true"\n')
    sh("git", "add", "-A", cwd=work)
    sh("git", "commit", "-q", "-m", "t", cwd=work)
    for i in range(n):
        sh("git", "branch", "-q", f"task/t{i}", cwd=work)
    repo = pygit2.Repository(str(data / "repos" / "tput.git"))
    t0 = time.perf_counter()
    sh(
        "git",
        "push",
        "-q",
        "--atomic",
        http_url(data, "tput"),
        *[f"task/t{i}" for i in range(n)],
        cwd=work,
    )

    def done() -> bool:
        k = 0
        for i in range(n):
            c = repo.revparse_single(f"refs/heads/task/t{i}")
            if "Kovanex-State: succeeded" in c.message:
                k += 1
        return k == n

    wait(done, 600)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pushes", type=int, default=40)
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--runners", type=int, default=None, help="default: init's default")
    ap.add_argument(
        "--own-refs-anchor",
        action="store_true",
        help="the anchor holds only the pusher's commits (issue 2's anchor), not Kovanex's refs",
    )
    a = ap.parse_args()
    install_cleanup()
    tmp = sandbox("kx-bench-")
    data = tmp / "n1"
    # units are named by node, and another bench on this host may run an "n1"
    proc = start_http_agent(data, f"pb{os.getpid()}", a.runners)
    try:
        time.sleep(2.0)  # let the agent settle before sampling idle RSS (a measurement, not sync)
        rss = psutil.Process(proc.pid).memory_info().rss / 2**20
        r = bench_push(tmp, data, a.pushes, not a.own_refs_anchor)
        agent = psutil.Process(proc.pid)
        c0 = agent.cpu_times()
        tput = bench_throughput(tmp, data, a.tasks)
        c1 = agent.cpu_times()
        floor = floor_rate(tmp, a.tasks)
    finally:
        stop(proc)

    def cpu(c0: Any, c1: Any, children: bool) -> str:
        f = ("children_user", "children_system") if children else ("user", "system")
        return f"{1000 * sum(getattr(c1, k) - getattr(c0, k) for k in f) / a.tasks:.1f}"

    ms = lambda xs, p: f"{1000 * pct(xs, p):.1f}"  # noqa: E731
    ratio50 = p50(r["kovanex"]) / p50(r["plain"])
    ratio95 = pct(r["kovanex"], 95) / pct(r["plain"], 95)
    print(
        md_table(
            ["figure", "kovanex", "anchor", "ratio", "goal"],
            [
                [
                    "push p50 (ms)",
                    ms(r["kovanex"], 50),
                    ms(r["plain"], 50) + " plain bare",
                    f"{ratio50:.2f}",
                    "≤1.3",
                ],
                [
                    "push p95 (ms)",
                    ms(r["kovanex"], 95),
                    ms(r["plain"], 95) + " plain bare",
                    f"{ratio95:.2f}",
                    "",
                ],
                ["push return → first step p50 (ms)", ms(r["first_step"], 50), "", "", "≤50"],
                ["push return → first step p95 (ms)", ms(r["first_step"], 95), "", "", ""],
                [
                    f"trivial tasks/s ({a.tasks} tasks over HTTP, {a.runners or 'default'} runners)",
                    f"{tput:.1f}",
                    f"{floor:.1f} floor",
                    f"{tput / floor:.3f}",
                    "≥0.33 of the floor",
                ],
                ["agent CPU ms/task, throughput run (itself)", cpu(c0, c1, False), "", "", ""],
                ["agent CPU ms/task, throughput run (children)", cpu(c0, c1, True), "", "", ""],
                ["agent idle RSS (MB)", f"{rss:.1f}", "", "", "≤80"],
            ],
        )
    )


if __name__ == "__main__":
    main()
