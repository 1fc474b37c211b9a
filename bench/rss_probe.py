"""Issue 11: where the agent's own memory goes with 10,000 finished tasks in one repo.

Three nodes in one run, each with one repo: empty (the anchor), 10,000 finished tasks
due for archiving (dated 30 days ago, the default age is 7 days), and the same 10,000
not due (`archive_after = "3650d"`: a busy repo's last week). For each, the agent's own
RSS and anonymous memory from `/proc/<pid>/smaps_rollup` (children apart) when it is
ready, after its first housekeeping pass (archive + maintenance), and after `--pushes`
one-step tasks, each waited for until it succeeded. scale_bench gives the same figure
as "idle RSS" for the agent and its children together.
Run: .venv/bin/python -m bench.rss_probe [--tasks 10000] [--pushes 8]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import psutil
import pygit2

from bench.common import (
    install_cleanup,
    kx,
    md_table,
    sandbox,
    sh,
    start_agent,
    stop,
    task_clone,
    wait,
)
from bench.seed import seed

SPEC = '[[steps]]\nname = "s"\nrun = "true"\n'


def own_memory(pid: int) -> tuple[float, float]:
    """(RSS, anonymous) MiB of the process alone."""
    got = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Rss", "Anonymous"):
            got[key] = int(value.split()[0]) / 1024
    return got["Rss"], got["Anonymous"]


def status(data: Path) -> dict:
    return json.loads(kx(data, "status", "--format", "json"))


def measure(tmp: Path, label: str, tasks: int, archive_after: str, pushes: int) -> list:
    data = tmp / label
    name = f"rp{os.getpid() % 100000}{label}"
    kx(data, "init", "--name", name, "--bind", "127.0.0.1:0", "--runners", "2")
    toml = data / "kovanex.toml"
    toml.write_text(toml.read_text() + f'\n[maintenance]\narchive_after = "{archive_after}"\n')
    kx(data, "repo", "create", "bench")
    repo = data / "repos" / "bench.git"
    seed(repo, tasks)
    agent = start_agent(data, name, 2)
    ready = own_memory(agent.pid)
    wait(lambda: status(data).get("upkeep_runs", 2) >= 2, 600)
    wait(lambda: not psutil.Process(agent.pid).children(recursive=True), 60)
    upkept = own_memory(agent.pid)
    work = tmp / f"w-{label}"
    task_clone(work, SPEC)
    pg = pygit2.Repository(str(repo))

    def succeeded(i: int) -> bool:
        r = pg.references.get(f"refs/heads/task/p{i}")
        return r is not None and "Kovanex-State: succeeded" in pg[r.target].message

    for i in range(pushes):
        sh("git", "commit", "-q", "--allow-empty", "-m", f"p{i}", cwd=work)
        sh("git", "branch", "-q", f"task/p{i}", cwd=work)
        sh("git", "push", "-q", str(repo), f"task/p{i}", cwd=work)
        wait(lambda i=i: succeeded(i), 60)
    wait(lambda: not psutil.Process(agent.pid).children(recursive=True), 60)
    pushed = own_memory(agent.pid)
    stop(agent)
    return [label, *(f"{rss:.1f} / {anon:.1f}" for rss, anon in (ready, upkept, pushed))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--pushes", type=int, default=8)
    args = ap.parse_args()
    install_cleanup()
    tmp = sandbox("kx-rss-")
    rows = [
        measure(tmp, "empty", 0, "7d", args.pushes),
        measure(tmp, "archived", args.tasks, "7d", args.pushes),
        measure(tmp, "not-due", args.tasks, "3650d", args.pushes),
    ]
    print(f"agent's own RSS / anonymous MiB, {args.tasks} finished tasks, {args.pushes} pushes")
    heads = ["repo", "ready", "after first upkeep", f"after {args.pushes} pushes"]
    print(md_table(heads, rows))


if __name__ == "__main__":
    main()
