"""Enqueue → first step of two checkouts side by side, push by push (issue 22 part 6).

On a shared host the load moves within a minute, so two benches run one after the other
compare loads as much as code. Here both checkouts run an agent at once (init defaults,
2 slots, units as root), and their one-task pushes alternate (A, B, B, A, ...): each pair
of samples sees the same moment's load. A task is peer_bench's latency task: one step
`date +%s.%N` into a stamp file; its latency runs from just before `git push` (over HTTP,
with the node's token) to the stamp, so it includes the push, as issue 22's goal does.

Run: .venv/bin/python -m bench.latency_pair --before /path/to/old/checkout [--pushes 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from bench.common import install_cleanup, md_table, pct, sandbox, sh, spawn, step_writable, wait
from kovanex import config as cfgmod

HERE = Path(__file__).resolve().parent.parent


class Side:
    """One checkout's agent, repo, clone and stamps."""

    def __init__(self, name: str, checkout: Path, root: Path) -> None:
        self.name = name
        self.env = {**os.environ, "PYTHONPATH": str(checkout)}
        self.data = root / name / "kx"
        self.data.parent.mkdir(parents=True)
        node = f"lp{name}{os.getpid() % 100000}"
        self.kx("init", "--name", node, "--bind", "127.0.0.1:0", "--runners", "2")
        cmd = [sys.executable, "-m", "kovanex", "--data", str(self.data), "agent"]
        log = open(self.data / "agent.log", "ab")
        self.agent = spawn([*cmd, "--log-level", "warning"], env=self.env, stdout=log, stderr=log)
        pid = self.data / "run" / "agent.pid"
        wait(lambda: pid.exists() and pid.read_text().strip() == str(self.agent.pid), 120)
        self.kx("repo", "create", "lat")
        bind = tomllib.loads((self.data / "kovanex.toml").read_text())["http"]["bind"]
        secret = cfgmod.read_token(cfgmod.Layout(self.data))
        self.url = f"http://{bind}/git/lat.git"
        self.auth = ["-c", f"http.extraHeader=Authorization: Bearer {secret}"]
        self.stamps = step_writable(root / name / "stamps")
        self.work = root / name / "work"
        sh("git", "init", "-q", str(self.work))
        (self.work / ".kovanex").mkdir()
        step = f'[[steps]]\nname = "s"\nrun = "date +%s.%N > {self.stamps}/$KOVANEX_TASK"\n'
        (self.work / ".kovanex" / "task.toml").write_text(step)
        sh("git", "add", "-A", cwd=self.work)
        sh("git", "commit", "-q", "-m", "stamp", cwd=self.work)
        self.latency: list[float] = []
        self.push: list[float] = []

    def kx(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "kovanex", "--data", str(self.data), *args]
        subprocess.run(cmd, env=self.env, check=True, capture_output=True)

    def one(self, tid: str) -> None:
        sh("git", "commit", "-q", "--allow-empty", "-m", tid, cwd=self.work)
        sent = time.time()
        push = [*self.auth, "push", "-q", self.url, f"HEAD:refs/heads/task/{tid}"]
        done = subprocess.run(["git", *push], cwd=self.work, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench: {self.name}: push of {tid} failed: {done.stderr.strip()}")
        self.push.append(time.time() - sent)
        stamp = self.stamps / tid
        wait(lambda: stamp.exists() and stamp.read_text().endswith("\n"), 60, what=f"{tid}")
        self.latency.append(float(stamp.read_text()) - sent)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True, help="checkout of the old code")
    ap.add_argument("--after", type=Path, default=HERE, help="checkout of the new code")
    ap.add_argument("--pushes", type=int, default=40, help="samples per checkout")
    a = ap.parse_args()
    install_cleanup()
    root = sandbox("kx-latpair-")
    sides = [Side("before", a.before.resolve(), root), Side("after", a.after.resolve(), root)]
    for s in sides:
        s.one("warm")
        s.latency.clear()
        s.push.clear()
    for i in range(a.pushes):
        for s in sides if i % 2 == 0 else sides[::-1]:
            s.one(f"l{i}")
    rows = []
    for s in sides:
        rows.append(
            [
                s.name,
                f"{1000 * statistics.median(s.latency):.1f}",
                f"{1000 * pct(s.latency, 95):.1f}",
                f"{1000 * statistics.median(s.push):.1f}",
                f"{1000 * statistics.median(x - p for x, p in zip(s.latency, s.push, strict=True)):.1f}",
            ]
        )
    b, c = sides
    ratio = statistics.median(x / y for x, y in zip(c.latency, b.latency, strict=True))
    print(f"load average {os.getloadavg()[0]:.2f}; after/before per pair, median {ratio:.2f}")
    print(
        md_table(
            [
                "checkout",
                "enqueue→start p50 ms",
                "p95 ms",
                "push p50 ms",
                "push return→start p50 ms",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
