"""Issue 5 benchmarks with real agents on loopback (LAN gossip profile).

- resume time: kill -9 of a task's runner -> the interrupted step starts on another node;
  anchor: the seed's 60 s to "dead" (+ reschedule) in the same table.

Run: .venv/bin/python -m bench.cluster_bench [--trials 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import (
    install_cleanup,
    kx,
    md_table,
    p50,
    pct,
    sandbox,
    sh,
    spawn,
    step_writable,
    wait,
)

PY = sys.executable


class Cluster:
    def __init__(
        self, root: Path, pools: dict[str, str], profile: str = "lan", init: tuple[str, ...] = ()
    ) -> None:
        self.root = root
        self.nodes = list(pools)
        token = "bench-token"
        for name, pool in pools.items():
            kx(
                root / name,
                "init",
                "--name",
                name,
                "--labels",
                f"pool={pool}",
                "--bind",
                "127.0.0.1:0",
                "--token",
                token,
                "--profile",
                profile,
                *init,
            )
        self.procs: dict[str, subprocess.Popen] = {}
        first = self.nodes[0]
        self.seed = (root / first / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]
        for name in self.nodes:
            self.start(name)

    def start(self, name: str) -> None:
        d = self.root / name
        args = [] if name == self.nodes[0] else ["--join", self.seed]
        log = open(d / "agent.log", "ab")
        self.procs[name] = spawn(
            [PY, "-m", "kovanex", "--data", str(d), "agent", "--log-level", "warning", *args],
            stdout=log,
            stderr=log,
        )
        wait(lambda: (d / "run" / "hook").exists(), 30)

    def kill9(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(15)

    def alive_count(self, observer: str) -> int:
        ms = json.loads(kx(self.root / observer, "members", "--format", "json"))
        return sum(m["status"] == "alive" for m in ms)


def kill_and_time(c: Cluster, starts: Path) -> float:
    """kill -9 the step's holder; seconds until the step starts on the other node."""
    wait(lambda: any(starts.iterdir()), 60)
    holder = next(starts.iterdir()).name
    marker = starts / ("y" if holder == "x" else "x")
    killed = time.time()
    c.kill9(holder)
    wait(lambda: marker.exists() and marker.read_text().strip(), 90)
    return float(marker.read_text()) - killed


def resume_trials(root: Path, trials: int) -> list[float]:
    out = []
    for t in range(trials):
        base = root / f"r{t}"
        base.mkdir()
        c = Cluster(base, {"o": "a", "x": "b", "y": "b"})
        try:
            wait(lambda c=c: c.alive_count("o") == 3, 30)
            kx(base / "o", "repo", "create", "demo")
            work = base / "w"
            sh("git", "init", "-q", str(work))
            starts = step_writable(base / "starts")
            (work / ".kovanex").mkdir()
            (work / ".kovanex" / "task.toml").write_text(
                '[placement]\nlabels = { pool = "b" }\n'
                '[[steps]]\nname = "one"\nrun = "true"\n'
                f'[[steps]]\nname = "two"\nrun = "date +%s.%N > {starts}/$KOVANEX_NODE; sleep 600"\n'
            )
            sh("git", "add", "-A", cwd=work)
            sh("git", "commit", "-q", "-m", "t", cwd=work)
            sh(
                "git",
                "push",
                "-q",
                str(base / "o" / "repos" / "demo.git"),
                "HEAD:refs/heads/task/r",
                cwd=work,
            )
            out.append(kill_and_time(c, starts))
            holder = next(p for p in ("x", "y") if c.procs[p].poll() is not None)
            other = "y" if holder == "x" else "x"
            for f in (base / holder / "run" / "steps").glob("*.json"):
                try:
                    os.killpg(json.loads(f.read_text())["pid"], signal.SIGKILL)
                except (ProcessLookupError, KeyError, ValueError):
                    pass
            c.procs[other].terminate()
        finally:
            c.stop()
            for n in ("x", "y"):
                for f in (
                    (base / n / "run" / "steps").glob("*.json")
                    if (base / n / "run" / "steps").exists()
                    else []
                ):
                    try:
                        os.killpg(json.loads(f.read_text())["pid"], signal.SIGKILL)
                    except (ProcessLookupError, KeyError, ValueError):
                        pass
    return out


def rev(repo: Path, ref: str) -> str | None:
    p = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "-q", "--verify", ref], capture_output=True, text=True
    )
    return p.stdout.strip() or None


def replication_figures(root: Path, pushes: int) -> dict[str, list[float]]:
    """Async lag, sync cost vs none, and owner takeover on one 3-node cluster."""
    base = root / "repl"
    base.mkdir()
    c = Cluster(base, {"o": "a", "x": "b", "y": "b"})
    out: dict[str, list[float]] = {"lag": [], "none": [], "sync": [], "takeover": []}
    try:
        wait(lambda: c.alive_count("o") == 3, 30)
        o = base / "o"
        for name in ("alag", "plain", "strict"):
            kx(o, "repo", "create", name)
        kx(o, "repo", "replication", "plain", "none", "--replicas", "0")
        kx(o, "repo", "replication", "alag", "async", "--replicas", "1")
        kx(o, "repo", "replication", "strict", "sync", "--replicas", "2")

        def replicas_of(repo: str) -> list[str]:
            st = json.loads(kx(o, "repo", "status", repo, "--format", "json"))
            return sorted(st.get("replicas", {}))

        print("bench: waiting for replicas to be placed", file=sys.stderr, flush=True)
        wait(lambda: len(replicas_of("alag")) == 1 and len(replicas_of("strict")) == 2, 60)
        print("bench: replicas placed", file=sys.stderr, flush=True)
        mirror = base / replicas_of("alag")[0] / "repos" / "alag.git"
        wait(mirror.exists, 30)
        work = base / "wr"
        sh("git", "init", "-q", str(work))
        for i in range(pushes):
            (work / "f").write_text(str(i))
            sh("git", "add", "-A", cwd=work)
            sh("git", "commit", "-q", "-m", f"c{i}", cwd=work)
            oid = sh("git", "rev-parse", "HEAD", cwd=work).strip()
            for repo, acc in (("plain", out["none"]), ("strict", out["sync"])):
                t0 = time.perf_counter()
                sh(
                    "git",
                    "push",
                    "-q",
                    str(o / "repos" / f"{repo}.git"),
                    f"HEAD:refs/heads/b{i}",
                    cwd=work,
                )
                acc.append(time.perf_counter() - t0)
            sh(
                "git",
                "push",
                "-q",
                str(o / "repos" / "alag.git"),
                f"HEAD:refs/heads/b{i}",
                cwd=work,
            )
            t0 = time.perf_counter()
            wait(lambda i=i, oid=oid: rev(mirror, f"refs/heads/b{i}") == oid, 30)
            out["lag"].append(time.perf_counter() - t0)
        # owner takeover: kill -9 the owner; time until a replica accepts a push
        c.kill9("o")
        killed = time.perf_counter()
        (work / "f").write_text("after")
        sh("git", "add", "-A", cwd=work)
        sh("git", "commit", "-q", "-m", "after", cwd=work)
        accepted = False
        while not accepted and time.perf_counter() - killed < 120:
            for n in ("x", "y"):
                p = subprocess.run(
                    [
                        "git",
                        "push",
                        "-q",
                        str(base / n / "repos" / "alag.git"),
                        "HEAD:refs/heads/after",
                    ],
                    cwd=work,
                    capture_output=True,
                    text=True,
                )
                if p.returncode == 0:
                    accepted = True
                    break
            time.sleep(0.05)
        out["takeover"].append(time.perf_counter() - killed if accepted else float("nan"))
    finally:
        c.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--pushes", type=int, default=30)
    ap.add_argument(
        "--replication-only", action="store_true", help="skip the resume trials (issue 11 part 3)"
    )
    a = ap.parse_args()
    install_cleanup()
    root = sandbox("kx-cbench-")
    res = [] if a.replication_only else resume_trials(root, a.trials)
    print(f"bench: resume trials done: {res}", file=sys.stderr, flush=True)
    rep = replication_figures(root, a.pushes)

    def ms(xs: list[float], q: float) -> str:
        return f"{1000 * pct(xs, q):.1f}"

    sync_ratio = p50(rep["sync"]) / p50(rep["none"])
    rows = [
        [
            "resume: kill -9 of runner → step restarts elsewhere (s)",
            f"{p50(res):.2f}" if res else "—",
            f"{pct(res, 95):.2f}" if res else "—",
            len(res),
            "seed: 60 s to dead + reschedule",
            "≤3 s",
        ],
        [
            "async replica lag: push return → ref on replica (ms)",
            ms(rep["lag"], 50),
            ms(rep["lag"], 95),
            len(rep["lag"]),
            "async RPO bound",
            "p50 ≤100 ms",
        ],
        [
            "push to a `none` repo (ms)",
            ms(rep["none"], 50),
            ms(rep["none"], 95),
            len(rep["none"]),
            "",
            "",
        ],
        [
            "push to a `sync` repo, 2 replicas (ms)",
            ms(rep["sync"], 50),
            ms(rep["sync"], 95),
            len(rep["sync"]),
            f"ratio {sync_ratio:.2f} to none",
            "≤2.0",
        ],
        [
            "sync push ÷ `none` push, p50 (same run)",
            f"{sync_ratio:.2f}",
            "",
            len(rep["sync"]),
            "",
            "≤2.0",
        ],
        [
            "owner takeover: kill -9 → a replica accepts a push (s)",
            f"{rep['takeover'][0]:.2f}",
            "",
            1,
            "Gitaly RTO <10 s",
            "",
        ],
    ]
    print(md_table(["figure", "p50", "p95", "n", "anchor", "goal"], rows))


if __name__ == "__main__":
    main()
