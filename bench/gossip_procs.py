"""Issue 3, real processes: 50 gossip processes on loopback (LAN profile); time from one
new node's join until every node lists it alive.

The processes are `python -m kovanex.net.node` (the agent's GossipNode without the git
and runner parts), so 50 of them fit on 2 cores; the timing is the gossip layer's.

Run: .venv/bin/python -m bench.gossip_procs [--nodes 50] [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import install_cleanup, md_table, p50, pct, spawn, wait


def start(root: Path, name: str, join: str | None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "kovanex.net.node",
        "--name",
        name,
        "--state-file",
        str(root / f"{name}.json"),
    ]
    if join:
        cmd += ["--join", join]
    return spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def state(root: Path, name: str) -> dict:
    try:
        return json.loads((root / f"{name}.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def alive_seen(root: Path, observer: str) -> set[str]:
    return {m["name"] for m in state(root, observer).get("members", []) if m["status"] == "alive"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--trials", type=int, default=3)
    a = ap.parse_args()
    install_cleanup()
    root = Path(tempfile.mkdtemp(prefix="kx-gprocs-"))
    procs: dict[str, subprocess.Popen] = {}
    times: list[float] = []
    try:
        procs["g0"] = start(root, "g0", None)
        wait(lambda: state(root, "g0").get("addr"), 30)
        seed = "{}:{}".format(*state(root, "g0")["addr"])
        names = [f"g{i}" for i in range(a.nodes - 1)]
        for n in names[1:]:
            procs[n] = start(root, n, seed)
        wait(lambda: all(len(alive_seen(root, n)) == len(names) for n in names), 180)
        for t in range(a.trials):
            new = f"new{t}"
            procs[new] = start(root, new, seed)
            wait(lambda new=new: state(root, new).get("addr"), 30)
            t0 = time.monotonic()
            wait(lambda new=new: all(new in alive_seen(root, n) for n in names), 60)
            times.append(time.monotonic() - t0)
            procs.pop(new).terminate()
            wait(lambda new=new: all(new not in alive_seen(root, n) for n in names), 60)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(10)
    print(
        md_table(
            ["figure", "p50 s", "p95 s", "trials", "processes"],
            [
                [
                    "a join seen alive by every other process",
                    f"{p50(times):.2f}",
                    f"{pct(times, 95):.2f}",
                    len(times),
                    a.nodes,
                ]
            ],
        )
    )


if __name__ == "__main__":
    main()
